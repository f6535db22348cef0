"""The subset of kustomize that examples/kubernetes uses, so CI can render the overlays without a
kustomize binary: `resources` (files and directories), `namespace`, `images` (newName/newTag) and
`patches` given as JSON 6902 operations (add, replace, remove) with a kind/name target; YAML aliases
are expanded into copies, as kustomize does. Anything else in a kustomization is refused, so the
examples cannot drift past what this renderer checks.
`test_kubernetes.py` compares its output with `kubectl kustomize` wherever kubectl is installed."""

from __future__ import annotations

import copy
import json
import os

import yaml

KNOWN_KEYS = {"apiVersion", "kind", "resources", "namespace", "images", "patches"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  "PersistentVolume", "StorageClass", "PriorityClass"}


class UnsupportedKustomization(ValueError):
    pass


def render(directory: str) -> list[dict]:
    """The resources `kustomize build directory` emits (order not significant)."""
    with open(os.path.join(directory, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    unknown = set(k) - KNOWN_KEYS
    if unknown:
        raise UnsupportedKustomization(f"{directory}: {sorted(unknown)} not supported by the lite renderer")
    docs: list[dict] = []
    for res in k.get("resources", []):
        path = os.path.normpath(os.path.join(directory, res))
        if os.path.isdir(path):
            docs += render(path)
        else:
            with open(path) as f:  # an alias becomes its own copy, as in kustomize (a patch changes one)
                docs += [json.loads(json.dumps(d)) for d in yaml.safe_load_all(f) if d]
    for p in k.get("patches", []):
        _patch(docs, p, directory)
    if "namespace" in k:
        for d in docs:
            if d["kind"] not in CLUSTER_SCOPED:
                d.setdefault("metadata", {})["namespace"] = k["namespace"]
    for image in k.get("images", []):
        for d in docs:
            for c in _containers(d):
                _retag(c, image)
    return docs


def _containers(node) -> list[dict]:
    """Every container of a document: kustomize's `images` rewrites each `containers` and `initContainers`
    list wherever it is (a Deployment's pod template, a LeaderWorkerSet's leader and worker templates)."""
    out: list[dict] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("containers", "initContainers") and isinstance(v, list):
                out += [c for c in v if isinstance(c, dict)]
            else:
                out += _containers(v)
    elif isinstance(node, list):
        for v in node:
            out += _containers(v)
    return out


def _retag(container: dict, image: dict) -> None:
    ref = container.get("image", "")
    name, tag = ref, None
    if "@" not in ref and ":" in ref.rsplit("/", 1)[-1]:
        name, tag = ref.rsplit(":", 1)
    if name != image["name"]:
        return
    container["image"] = image.get("newName", name) + (f":{image['newTag']}" if "newTag" in image
                                                        else (f":{tag}" if tag else ""))


def _patch(docs: list[dict], p: dict, directory: str) -> None:
    if set(p) - {"target", "patch", "path"}:
        raise UnsupportedKustomization(f"patch keys {sorted(p)}")
    target = p.get("target") or {}
    if set(target) - {"kind", "name"}:
        raise UnsupportedKustomization(f"patch target keys {sorted(target)}")
    text = p.get("patch")
    if text is None:
        with open(os.path.join(directory, p["path"])) as f:
            text = f.read()
    ops = yaml.safe_load(text)
    if not isinstance(ops, list):
        raise UnsupportedKustomization("only JSON 6902 patches (a list of operations)")
    hits = [d for d in docs if target.get("kind", d.get("kind")) == d.get("kind")
            and target.get("name", d["metadata"]["name"]) == d["metadata"]["name"]]
    if not hits:
        raise UnsupportedKustomization(f"patch target {target} matches nothing")
    for d in hits:
        for op in ops:
            apply_op(d, op)


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise ValueError(f"JSON pointer must start with '/': {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def apply_op(doc: dict, op: dict) -> None:
    """One JSON 6902 operation (add, replace, remove), in place."""
    *parents, last = _pointer(op["path"])
    node = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    kind = op["op"]
    if kind not in ("add", "replace", "remove"):
        raise UnsupportedKustomization(f"JSON 6902 op {kind!r}")
    if isinstance(node, list):
        if kind == "add":
            node.insert(len(node) if last == "-" else int(last), copy.deepcopy(op["value"]))
        elif kind == "replace":
            node[int(last)] = copy.deepcopy(op["value"])
        else:
            del node[int(last)]
        return
    if kind in ("replace", "remove") and last not in node:
        raise KeyError(f"{op['path']}: nothing to {kind}")
    if kind == "remove":
        del node[last]
    else:
        node[last] = copy.deepcopy(op["value"])
