"""Validate ../values.yaml against values.schema.subset.json (transcribed from the chart's
values.schema.json, see its $comment). Run:  PYTHONPATH=<dir with jsonschema> python validate.py

1. strict: the file alone against the schema as transcribed. Helm validates the *merged* values
   (chart defaults + this file), so the only acceptable errors here are `required` keys of maps
   that the chart's own values.yaml supplies; they are listed.
2. merged: the same, with `required` dropped only for those deep-merged maps (root, Daemon,
   Global, PostgreSQL): must give no error at all.
3. negative controls: typos in key names must be rejected.
"""
import copy, json, pathlib, sys
import yaml, jsonschema

here = pathlib.Path(__file__).parent
schema = json.loads((here / "values.schema.subset.json").read_text())
values = yaml.safe_load((here.parent / "values.yaml").read_text())
V = jsonschema.Draft7Validator
V.check_schema(schema)

def errors(sch, doc):
    return sorted(V(sch).iter_errors(doc), key=lambda e: list(e.absolute_path))

print("1. strict (file alone):")
strict = errors(schema, values)
for e in strict:
    print(f"   {e.validator}: {'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}")
assert all(e.validator == "required" for e in strict), "non-required error"

merged = copy.deepcopy(schema)
merged.pop("required")
for name in ("Daemon", "Global", "PostgreSQL"):
    merged["definitions"][name].pop("required")
m = errors(merged, values)
print(f"2. merged-defaults view: {len(m)} error(s)")
for e in m:
    print("   ", e.message)

print("3. negative controls:")
def bad(path, key, val):
    doc = copy.deepcopy(values)
    node = doc
    for k in path:
        node = node[k]
    node[key] = val
    errs = errors(merged, doc)
    print(f"   {'/'.join(map(str, path + [key]))}: {'rejected' if errs else 'ACCEPTED'}"
          + (f" ({errs[0].message[:80]})" if errs else ""))
    return bool(errs)
ok = all([
    bad(["runLauncher", "config", "k8sRunLauncher"], "envSecret", [{"name": "x"}]),
    bad(["runLauncher", "config", "k8sRunLauncher"], "volumeMount", []),
    bad(["dagsterDaemon", "runCoordinator", "config", "queuedRunCoordinator"], "max_concurrent_runs", 8),
    bad(["dagsterDaemon", "runCoordinator"], "maxConcurrentRuns", 8),
    bad(["dagsterDaemon", "runCoordinator", "config", "queuedRunCoordinator", "tagConcurrencyLimits", 0], "values", "x"),
    bad(["runLauncher"], "k8sRunLauncher", {}),
    bad(["runLauncher", "config", "k8sRunLauncher", "runK8sConfig"], "podSpec", {}),
])
print("   all rejected" if ok else "   SOME ACCEPTED")
sys.exit(0 if (not m and ok) else 1)
