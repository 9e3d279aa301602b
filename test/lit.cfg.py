"""lit configuration of logos-ir: every folder under test/ holds lit tests named after the pass or stage it pins."""

import os
import shutil
import sys

import lit.formats

config.name = "logos-ir"  # noqa: F821 (lit provides `config`)
config.test_format = lit.formats.ShTest(execute_external=False)  # noqa: F821
config.suffixes = [".mlir", ".logos", ".test"]  # noqa: F821
config.excludes = ["unit", "fuzz", "lit.cfg.py", "__pycache__"]  # noqa: F821
config.test_source_root = os.path.dirname(__file__)  # noqa: F821
config.environment["PYTHONHASHSEED"] = "0"  # noqa: F821
config.environment["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")  # noqa: F821
if "PYTHONPATH" in os.environ:  # a checkout run without installing it
    config.environment["PYTHONPATH"] = os.environ["PYTHONPATH"]  # noqa: F821


def tool(name: str) -> str:
    found = shutil.which(name, path=config.environment["PATH"])  # noqa: F821
    if found is None:
        raise RuntimeError(f"lit: '{name}' is not installed; run the README's test command (it installs logos-ir)")
    return found


config.substitutions.append(("%logos-opt", tool("logos-opt")))  # noqa: F821
config.substitutions.append(("%logos-author", tool("logos-author")))  # noqa: F821
config.substitutions.append(("%logos-compile", tool("logos-compile")))  # noqa: F821
config.substitutions.append(("%filecheck", tool("filecheck")))  # noqa: F821
# RUN lines as LLVM developers write them: `FileCheck` is the filecheck port (lit's own shell runs `not`), and the
# tools by their bare names resolve on PATH above.
config.substitutions.append((r"(?<![\w%./-])FileCheck(?![\w.-])", tool("filecheck")))  # noqa: F821

# Tests that need a tool this machine may lack say so with `REQUIRES:`.
if shutil.which("nvcc"):
    config.available_features.add("nvcc")  # noqa: F821
