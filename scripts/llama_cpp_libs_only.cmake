# Included by llama.cpp's project() while llama-cpp-python builds it (the Makefile's $(VENV)/.gguf passes
# -DCMAKE_PROJECT_llama.cpp_INCLUDE=<this file> in CMAKE_ARGS). llama-cpp-python forces LLAMA_BUILD_COMMON on
# (a cache FORCE that -DLLAMA_BUILD_COMMON=OFF cannot undo), which compiles llama.cpp's `common` library (CLI
# argument parsing, chat-template parsers, an HTTP client with OpenSSL): about a third of the compile, and nothing
# the Python package loads (it ships libllama, libggml*, libmtmd). A directory-scope variable shadows the cache one
# (policy CMP0077), so llama.cpp skips common and its HTTP client; libmtmd does not use them.
set(LLAMA_BUILD_COMMON OFF)
