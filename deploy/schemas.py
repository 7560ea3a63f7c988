"""Lay out JSON schemas for kubeconform from packages fetched by their own registries'
clients, so validating the chart downloads nothing at run time:

* Kubernetes: the schemas the PyPI package ``kubernetes-validate`` ships (one folder per
  Kubernetes version). They name their shared definitions by an absolute ``$id``; the copy
  made here refers to ``_definitions.json`` beside each file instead.
* Custom resources: the ``openAPIV3Schema`` of CustomResourceDefinition YAML files (KEDA's,
  from its Go module), turned into strict JSON schemas: an object with listed properties
  takes no others unless the CRD says it preserves unknown fields.

    python deploy/schemas.py --k8s-package DIR --k8s-version 1.31.0 \
        --crd path/to/crd.yaml ... --out build/deploy-schemas
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml


def copy_kubernetes(package: Path, version: str, out: Path) -> Path:
    """``out/k8s/v<version>-local-strict``, with refs relative to the folder."""
    src = package / "kubernetes-json-schema" / f"v{version}-local-strict"
    if not src.is_dir():
        have = sorted(p.name for p in (package / "kubernetes-json-schema").iterdir())
        raise SystemExit(f"no schemas for Kubernetes {version} in {package} (has {have})")
    dst = out / "k8s" / src.name
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    for f in src.glob("*.json"):
        doc = json.loads(f.read_text())
        doc.pop("$id", None)
        text = json.dumps(doc).replace('"/api/_definitions.json#', '"_definitions.json#')
        (dst / f.name).write_text(text)
    return dst


def strict(node: Any) -> Any:
    """Close every object schema that lists its properties (what the API server prunes)."""
    if isinstance(node, dict):
        out = {k: strict(v) for k, v in node.items()}
        if out.get("x-kubernetes-int-or-string"):
            out.pop("type", None)
            out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [strict(v) for v in node]
    return node


def crd_schemas(crd_file: Path, out: Path) -> list[Path]:
    """One schema per served version: ``out/crds/<group>/<kind>_<version>.json``."""
    written = []
    for crd in yaml.safe_load_all(crd_file.read_text()):
        if not crd or crd.get("kind") != "CustomResourceDefinition":
            continue
        group = crd["spec"]["group"]
        kind = crd["spec"]["names"]["kind"]
        for v in crd["spec"]["versions"]:
            schema = strict(v["schema"]["openAPIV3Schema"])
            props = schema.setdefault("properties", {})
            props["apiVersion"] = {"type": "string", "enum": [f"{group}/{v['name']}"]}
            props["kind"] = {"type": "string", "enum": [kind]}
            props["metadata"] = {"type": "object"}
            schema.setdefault("required", [])
            for key in ("apiVersion", "kind", "metadata"):
                if key not in schema["required"]:
                    schema["required"].append(key)
            path = out / "crds" / group / f"{kind.lower()}_{v['name']}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(schema))
            written.append(path)
    return written


def copy_written(src: Path, out: Path) -> list[Path]:
    """Schemas kept in this repository (deploy/schemas/<group>/<kind>_<version>.json)."""
    written = []
    for f in src.glob("*/*.json"):
        dst = out / "crds" / f.parent.name / f.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, dst)
        written.append(dst)
    return written


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k8s-package", type=Path, required=True, help="kubernetes_validate dir")
    ap.add_argument("--k8s-version", required=True, help="e.g. 1.31.0")
    ap.add_argument("--crd", type=Path, action="append", default=[], help="a CRD YAML file")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    k8s = copy_kubernetes(args.k8s_package, args.k8s_version, args.out)
    crds = [p for f in args.crd for p in crd_schemas(f, args.out)]
    crds += copy_written(Path(__file__).resolve().parent / "schemas", args.out)
    print(f"{k8s} ({len(list(k8s.glob('*.json')))} schemas), {len(crds)} custom resource schemas")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
