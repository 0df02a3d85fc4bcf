#!/usr/bin/env python3
"""Regenerates schema.txt: the protobuf field table the sim decodes kubectl's protobuf bodies with.

Field numbers and wire types come from the `k8s-pb` crate (kube-rs' prost bindings, generated from
the Kubernetes .proto files); JSON names from `k8s-openapi` (the serde names of the same structs).
Both are read from cargo's registry source directory, nothing is downloaded:

    cargo info k8s-pb@0.9.0 >/dev/null     # puts the crate's source into ~/.cargo/registry/src
    python3 src/sim/apiserver/protobuf/generate.py > src/sim/apiserver/protobuf/schema.txt

Only the messages reachable from the API groups the sim serves are written (see ROOTS).
"""
import glob
import os
import re
import sys

K8S_PB = "k8s-pb-0.9.0"
K8S_OPENAPI = "k8s-openapi-0.29.0"
OPENAPI_VERSION = "v1_33"
# k8s-pb modules whose messages are all roots (the groups/versions the sim serves, plus meta/v1).
ROOTS = [
    "api/core/v1", "api/apps/v1", "api/policy/v1", "api/coordination/v1", "api/events/v1",
    "api/storage/v1", "api/authentication/v1", "apimachinery/pkg/apis/meta/v1",
    "apimachinery/pkg/runtime",
]


def crate_dir(name):
    home = os.environ.get("CARGO_HOME", os.path.expanduser("~/.cargo"))
    hits = glob.glob(os.path.join(home, "registry/src/*", name))
    if not hits:
        sys.exit(f"{name} is not in cargo's registry source directory: run `cargo info {name.rsplit('-', 1)[0]}@{name.rsplit('-', 1)[1]}`")
    return hits[0]


def short(module):
    """Module path (api/core/v1) -> the table's package name (core.v1)."""
    for prefix in ("api/", "apimachinery/pkg/apis/", "apimachinery/pkg/"):
        if module.startswith(prefix):
            return module[len(prefix):].replace("/", ".")
    return module.replace("/", ".")


FIELD = re.compile(
    r"#\[prost\(([^\]]*?)\)\]\s*pub\s+(?:r#)?(\w+)\s*:\s*(.*?),\s*\n\s*(?=///|#\[|\})", re.S)
STRUCT = re.compile(r"pub struct (\w+) \{(.*?)\n\}", re.S)


def parse_pb(root):
    """{module: {Struct: [(tag, ident, attr, rust_type)]}}"""
    out = {}
    for path in glob.glob(os.path.join(root, "src", "**", "mod.rs"), recursive=True):
        module = os.path.relpath(os.path.dirname(path), os.path.join(root, "src"))
        text = open(path).read()
        structs = {}
        for m in STRUCT.finditer(text):
            body = m.group(2) + "\n}"
            fields = []
            for f in FIELD.finditer(body):
                attr, ident, ty = f.group(1), f.group(2), " ".join(f.group(3).split())
                tag = int(re.search(r'tag = "(\d+)"', attr).group(1))
                fields.append((tag, ident, attr, ty))
            structs[m.group(1)] = fields
        out[module] = structs
    return out


def resolve(module, path):
    """A Rust path inside `module` (`super::super::x::Y` or `Y`) -> (module, Struct)."""
    parts = path.split("::")
    mod = module.split("/")
    while parts and parts[0] == "super":
        mod = mod[:-1]
        parts = parts[1:]
    return "/".join(mod + parts[:-1]), parts[-1]


def message_type(ty):
    """The message named in a field's Rust type (the innermost non-std path)."""
    ty = ty.replace(" ", "")
    for wrapper in ("::core::option::Option<", "::prost::alloc::vec::Vec<", "::prost::alloc::boxed::Box<"):
        ty = ty.replace(wrapper, "")
    if ty.startswith("::prost::alloc::collections::BTreeMap<"):
        ty = ty[len("::prost::alloc::collections::BTreeMap<"):].split(",", 1)[1]
    return ty.rstrip(">,").rstrip(",")


def json_names(root, module, struct):
    """serde names of a k8s-openapi struct: {ident: json name}, or None when the struct is not there."""
    d = os.path.join(root, "src", OPENAPI_VERSION, module)
    want = struct.lower()
    if not os.path.isdir(d):
        return None
    for f in os.listdir(d):
        if f.replace("_", "").lower() == want + ".rs":
            text = open(os.path.join(d, f)).read()
            return {ident: name for name, ident in re.findall(r'"([^"]+)" => Field::Key_(\w+),', text)}
    return None


def lookup(names, ident):
    """The serde name of field `ident`: by identifier, else ignoring case and underscores."""
    if not names:
        return None
    for key in (ident, ident + "_"):
        if key in names:
            return names[key]
    norm = ident.replace("_", "").lower()
    hits = [n for i, n in names.items() if i.replace("_", "").lower() == norm]
    return hits[0] if len(hits) == 1 else None


def camel(ident):
    head, *rest = ident.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def kind_of(attr):
    if attr.startswith("btree_map"):
        value = re.search(r'btree_map = "string, (\w+)"', attr).group(1)
        return {"string": "S", "message": "M", "bytes": "Y"}[value]
    first = attr.split(",")[0].split("=")[0].strip()
    return {"string": "s", "int32": "i32", "int64": "i64", "bool": "b", "bytes": "y",
            "double": "d", "message": "m"}[first]


def main():
    pb = parse_pb(crate_dir(K8S_PB))
    oa = crate_dir(K8S_OPENAPI)
    todo = [(m, s) for m in ROOTS for s in pb[m]]
    seen, order = set(), []
    while todo:
        m, s = todo.pop(0)
        if (m, s) in seen:
            continue
        seen.add((m, s))
        order.append((m, s))
        for tag, ident, attr, ty in pb[m][s]:
            if "message" in attr:
                todo.append(resolve(m, message_type(ty)))
    print("# Generated by generate.py from k8s-pb 0.9.0 (field numbers) and k8s-openapi 0.29.0")
    print("# (JSON names); do not edit. `message <package>.<Name>`, then `<tag> <json> <kind>[*] [<type>]`:")
    print("# s string, i32/i64 integers, b bool, y bytes, d double, m message, S/Y/M map of string to")
    print("# string/bytes/message; `*` repeated. Names missing from k8s-openapi are camelCased (marked ~).")
    # Pass 1: JSON names per message; a message embedded inline takes its parent's names.
    names = {key: json_names(oa, *key) for key in order}
    inline = set()
    for m, s in order:
        for tag, ident, attr, ty in pb[m][s]:
            if names[(m, s)] is None or lookup(names[(m, s)], ident) is not None:
                continue
            if "message" not in attr or "repeated" in attr:
                continue
            # A Go struct embedded with `json:",inline"` is a field in the .proto: its JSON
            # fields sit in the parent object.
            rm, rs = resolve(m, message_type(ty))
            inner = {i.replace("_", "").lower() for _, i, _, _ in pb[rm][rs]}
            outer = {i.replace("_", "").lower() for i in names[(m, s)]}
            if inner and len(inner & outer) >= 0.8 * len(inner):
                inline.add((m, s, ident))
                if names[(rm, rs)] is None:
                    names[(rm, rs)] = names[(m, s)]
    for m, s in sorted(order, key=lambda x: (short(x[0]), x[1])):
        print(f"message {short(m)}.{s}")
        for tag, ident, attr, ty in sorted(pb[m][s]):
            name, mark = lookup(names[(m, s)], ident), ""
            if (m, s, ident) in inline:
                name = "-"
            if name is None:
                name, mark = camel(ident), "~"
            k = kind_of(attr) + ("*" if "repeated" in attr else "")
            ref = ""
            if "message" in attr:
                rm, rs = resolve(m, message_type(ty))
                ref = f" {short(rm)}.{rs}"
            print(f"{tag} {name}{mark} {k}{ref}")

main()
