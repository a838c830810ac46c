# Sourced by the device scripts (gpu_jobs.sh, rehearsal.sh): the wheel set installed once per machine into /tmp/site,
# and the environment every job runs in. Carry [".whl", ".rehearsal"]; for the Crafter presets .whl also holds
# crafter 1.8.3 (built from its sdist: `pip wheel --no-deps crafter==1.8.3`) and, from
# EXTRA_WHEELS="opensimplex ruamel.yaml ruamel.yaml.clib imageio", its dependencies. .rehearsal/ may hold llama-cpp-python's
# installed package and llama.cpp's converters (tar.xz, built on the development machine) for GGUF exports there;
# llama-cpp-python imports diskcache, which the device image lacks (build the wheels with EXTRA_WHEELS="diskcache"). Then:
#   make .venv/.gguf && VLRL_CACHE=$PWD/.cache/vlrl .venv/bin/python -c 'import vlrl.export as e; e.llama_cpp_tools()'
#   mkdir -p .rehearsal && echo /.rehearsal/ >> .git/info/exclude
#   tar -cJf .rehearsal/llama_cpp_python.tar.xz -C .venv/lib/python3.11/site-packages llama_cpp llama_cpp_python-0.3.36.dist-info
#   tar -cJf .rehearsal/llama_converters.tar.xz -C .cache/vlrl llama.cpp-0.3.36
# gemlite (the int8 decoding kernels) is an sdist too: `pip wheel --no-deps gemlite==0.6.0.post2 -w .whl`. Without
# it the packed base decodes through its dequantized weight at about half the speed (plan s53 ran so, unnoticed):
# refuse to measure that way
ls .whl/gemlite-*.whl > /dev/null 2>&1 || { echo "no gemlite wheel in .whl: see bench/device_setup.sh"; exit 1; }
if [ ! -f /tmp/site/.vlrl-installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  [ -f .rehearsal/llama_cpp_python.tar.xz ] && tar -xJf .rehearsal/llama_cpp_python.tar.xz -C /tmp/site
  [ -f .rehearsal/llama_converters.tar.xz ] && tar -xJf .rehearsal/llama_converters.tar.xz -C /tmp
  touch /tmp/site/.vlrl-installed
fi
export PYTHONPATH=/tmp/site:$PWD VLRL_CACHE=/tmp/vlrl-cache PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 \
  TOKENIZERS_PARALLELISM=false
[ -d /tmp/llama.cpp-0.3.36 ] && export VLRL_LLAMA_CPP=/tmp/llama.cpp-0.3.36
mkdir -p /tmp/results
