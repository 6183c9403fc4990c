"""Audit the installed dependency set for known vulnerabilities (pip-audit).

Fails on any known vulnerability. When no vulnerability database can be reached (on this
project's machines only the package index is reachable; PyPI's JSON API and OSV are not),
pip-audit cannot audit anything: this says so plainly instead of reporting a clean bill.
Run: .venv/bin/python scripts/audit.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

pip_audit = Path(sys.executable).parent / "pip-audit"
proc = subprocess.run(
    [str(pip_audit), "--progress-spinner", "off", "--skip-editable", "--format", "json"],
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
)
try:
    report = json.loads(proc.stdout)
except ValueError:
    print(f"audit: pip-audit gave no report (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    sys.exit(1)
deps = report.get("dependencies", [])
vulnerable = [d for d in deps if d.get("vulns")]
skipped = [d for d in deps if d.get("skip_reason")]
for d in vulnerable:
    for v in d["vulns"]:
        fixed = ", ".join(v.get("fix_versions", [])) or "?"
        print(f"audit: {d['name']} {d['version']}: {v['id']} (fixed in {fixed})")
if vulnerable:
    sys.exit(1)
if deps and len(skipped) == len(deps):
    print(
        f"audit: no vulnerability database reachable; {len(deps)} packages NOT audited "
        "(pip-audit needs PyPI's JSON API or OSV)"
    )
else:
    print(
        f"audit: {len(deps) - len(skipped)} packages audited, no known vulnerabilities "
        f"({len(skipped)} could not be audited)"
    )
