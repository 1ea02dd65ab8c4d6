"""What fits where: the planner's capability check on the current GPU (if any) and on
every named GPU.

Writes a JSON file with every row (buffers, rejected candidates, compiled
resources with --compile) and Markdown reports; the named-device Markdown is
committed as docs/capabilities.md and tests/test_explain.py checks it is current.

    PYTHONPATH=. python scripts/device_caps.py [--compile] [--out-dir DIR]

(from a checkout; with the package installed, without PYTHONPATH).
"""

import argparse
import json
import os
import sys
from pathlib import Path

from cupyattn.device import NAMED_DEVICES
from cupyattn.explain import capabilities, named_devices_markdown

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--compile", action="store_true", help="add NVRTC registers/spills to the JSON")
    parser.add_argument("--out-dir", default=str(REPO / "docs"))
    args = parser.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)

    report = {}
    for key in NAMED_DEVICES:
        report[key] = capabilities(key, compile=args.compile).to_dict()
    current = None
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            current = capabilities("current", compile=args.compile)
            report["current"] = current.to_dict()
            (out / "capabilities-current.md").write_text(current.to_markdown() + "\n")
    except Exception as exc:  # no GPU here: named devices only
        print(f"no current GPU ({type(exc).__name__}); named devices only")
    (out / "capabilities.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "capabilities.md").write_text(named_devices_markdown() + "\n")
    print(
        f"wrote {os.path.relpath(out / 'capabilities.md')} and capabilities.json"
        + (" and capabilities-current.md" if current else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
