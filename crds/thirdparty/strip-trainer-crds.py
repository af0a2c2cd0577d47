#!/usr/bin/env python3
"""Vendor Kubeflow Trainer v2's CRDs for the test bed (Kubernetes 1.20).

Usage: strip-trainer-crds.py TRAINER_CHECKOUT COMMIT
Reads manifests/base/crds/trainer.kubeflow.org_{trainjobs,trainingruntimes,
clustertrainingruntimes}.yaml of a kubeflow/trainer checkout and writes them here without
x-kubernetes-validations (CEL, Kubernetes 1.25+: the 1.20 API server rejects the field in a
server-side apply), without empty-string defaults (`default: ""` of object references' `name`:
the 1.20 API server reads them as null and rejects the CRD; a list-map key among them becomes
required, as a list-map key needs a default or to be required) and without descriptions (size).
Nothing else changes.
"""
import pathlib
import sys

import yaml

FILES = ["trainjobs", "trainingruntimes", "clustertrainingruntimes"]
DROP = ("x-kubernetes-validations", "description")


def key_required(o, stats):
    """A list-map key whose only default is "" becomes required (a list-map key needs one or
    the other, and the empty default goes)."""
    if isinstance(o, dict):
        items = o.get("items")
        for key in o.get("x-kubernetes-list-map-keys", []):
            prop = (items or {}).get("properties", {}).get(key, {})
            if prop.get("default") == "":
                del prop["default"]
                req = items.setdefault("required", [])
                if key not in req:
                    req.append(key)
                stats["required"] = stats.get("required", 0) + 1
        for v in o.values():
            key_required(v, stats)
    elif isinstance(o, list):
        for v in o:
            key_required(v, stats)


def strip(o, stats):
    if isinstance(o, dict):
        for k in DROP:
            if k in o:
                stats[k] = stats.get(k, 0) + 1
                del o[k]
        if o.get("default") == "":
            stats["default"] = stats.get("default", 0) + 1
            del o["default"]
        for v in o.values():
            strip(v, stats)
    elif isinstance(o, list):
        for v in o:
            strip(v, stats)


def main(checkout, commit):
    here = pathlib.Path(__file__).resolve().parent
    for f in FILES:
        src = pathlib.Path(checkout) / f"manifests/base/crds/trainer.kubeflow.org_{f}.yaml"
        docs = [d for d in yaml.safe_load_all(src.read_text()) if d]
        assert len(docs) == 1, src
        stats = {}
        key_required(docs[0]["spec"], stats)
        strip(docs[0]["spec"], stats)
        kind = docs[0]["spec"]["names"]["kind"]
        header = f"""# Kubeflow Trainer v2 CRD trainer.kubeflow.org/v1alpha1 {kind}, for the test bed
# and for clusters without Kubeflow Trainer (install Trainer itself when you run it: it ships
# these CRDs with their validation rules).
# Source: https://github.com/kubeflow/trainer manifests/base/crds/trainer.kubeflow.org_{f}.yaml
# at commit {commit} (Apache-2.0), generated there by controller-gen.
# Changed here, by crds/thirdparty/strip-trainer-crds.py: every x-kubernetes-validations
# ({stats.get('x-kubernetes-validations', 0)}, CEL rules: Kubernetes 1.25+; the test bed's 1.20 API server rejects the
# field in a server-side apply), every empty-string default ({stats.get('default', 0)}, `name: {{default: ""}}`
# of object references: the 1.20 API server reads "" as null and rejects the CRD; the
# {stats.get('required', 0)} that are list-map keys, e.g. imagePullSecrets[].name, are required instead) and every
# description ({stats.get('description', 0)}, to keep the file small) removed. Nothing else: the same
# schema, other defaults, list and map types.
"""
        out = header + yaml.safe_dump(docs[0], sort_keys=False, width=100)
        (here / f"trainer.kubeflow.org_{f}.yaml").write_text(out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
