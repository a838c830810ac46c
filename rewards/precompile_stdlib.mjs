// Precompiles Pyodide's standard library to bytecode, once, at install time (rewards/install.sh runs it):
//   node rewards/precompile_stdlib.mjs [PYODIDE_DIR]
// Pyodide's npm package ships the standard library as .py sources, so every page load compiled the modules
// Python imports at start-up: about 60% of the page's start-up CPU. This writes python_stdlib.pyc.zip beside
// python_stdlib.zip: the same modules compiled by the same Pyodide interpreter (so the same code, only no longer
// compiled in the browser), which calculator.js loads when it is there. vlrl's own files stay sources.

import { existsSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const pyodideDir = resolve(process.argv[2] ?? join(here, "node_modules", "pyodide"));
if (!existsSync(join(pyodideDir, "pyodide.mjs"))) {
  console.error(`precompile_stdlib: no Pyodide in ${pyodideDir}; run npm ci in rewards/ first.`);
  process.exit(1);
}
const { loadPyodide } = await import(join(pyodideDir, "pyodide.mjs"));
const python = await loadPyodide({ indexURL: `${pyodideDir}/` });
const zipped = python.runPython(`
import importlib.util, io, marshal, sys, zipfile

source = next(p for p in sys.path if p.endswith(".zip"))
out, compiled = io.BytesIO(), 0
with zipfile.ZipFile(source) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
    for info in zin.infolist():
        data = zin.read(info)
        if not info.filename.endswith(".py"):
            zout.writestr(info, data)
            continue
        try:
            code = compile(data, f"{source}/{info.filename}", "exec", dont_inherit=True)
        except SyntaxError:  # a test fixture or template: keep it as it was
            zout.writestr(info, data)
            continue
        # A timestamp .pyc with no source beside it in the zip: zipimport loads it without any check to fail.
        header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little") + (0).to_bytes(8, "little")
        zout.writestr(info.filename[:-3] + ".pyc", header + marshal.dumps(code))
        compiled += 1
print(f"precompile_stdlib: {compiled} modules compiled for Python {sys.version.split()[0]}")
out.getvalue()
`);
writeFileSync(join(pyodideDir, "python_stdlib.pyc.zip"), zipped.toJs());
zipped.destroy();
