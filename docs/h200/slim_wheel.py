"""Repack FlashInfer's wheel without the sources of kernels the H200 proof does not build.

The device machine takes at most 64 MiB of carried files, and flashinfer-python 0.7.2's wheel is
59 MB compressed, most of it kernel sources (data/csrc/*.cu) and CUTLASS. The verification's
FlashInfer check builds the activation kernel, which needs the headers (data/include, the csrc
headers, CCCL) only. Usage: python slim_wheel.py IN.whl OUT_DIR
"""

import sys
import zipfile
from pathlib import Path

DROP_DATA = ("flashinfer/data/cutlass/", "flashinfer/data/spdlog/")


def keep(name: str) -> bool:
    if name.startswith("flashinfer/data/csrc/"):
        return name.endswith((".h", ".cuh"))
    return not name.startswith(DROP_DATA)


def main() -> None:
    source, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(source) as whl, zipfile.ZipFile(out_dir / source.name, "w", zipfile.ZIP_DEFLATED) as out:
        for info in whl.infolist():
            if keep(info.filename):
                out.writestr(info, whl.read(info.filename))


if __name__ == "__main__":
    main()
