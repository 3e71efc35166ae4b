#!/usr/bin/env python3
"""A cross-vendor conformance campaign through the tovl binary, on the
backends this machine has (CI: cpu and Vulkan on lavapipe):

  python3 tests/cli_campaign.py TOVL GOLDEN SERVE_DEMO

- `tovl conform --golden-out` on the CPU writes the shipped GOLDEN byte for
  byte (else a case changed without the suite id and the file);
- `--against GOLDEN` passes on every backend here; its --json and --junit
  agree (the JUnit file parsed with xml.etree, counts per backend);
- a plain run at a fresh seed gives every backend the same digest on every
  case, in the JSON and in the --verbose lines;
- one digest changed fails that case alone (exit 1), named with its kernel
  and buffer, in stdout and in the JUnit file;
- another seed or suite, a newer or older suite, a truncated or non-JSON
  file, an unknown backend, a case missing, twice or with a bad digest: exit
  2 with the fault named;
- `tovl run --digest` on the serving demo's mixed batch prints the SHA-256 of
  the tensors it wrote, the same on every backend.
Standard library only. The seed is printed; TOVL_TEST_SEED replays it.
"""
import hashlib
import importlib.util
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

TOVL, GOLDEN, SERVE_DEMO = sys.argv[1:4]
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)
    return ok


# Under the sanitizers (tests/hardening.cmake) the tovl processes get the
# preload this interpreter runs without.
TOVL_ENV = dict(os.environ)
if os.environ.get("TOVL_CHILD_LD_PRELOAD"):
    TOVL_ENV["LD_PRELOAD"] = os.environ["TOVL_CHILD_LD_PRELOAD"]


def tovl(*args):
    p = subprocess.run([TOVL, *args], capture_output=True, text=True, env=TOVL_ENV)
    return p.returncode, p.stdout, p.stderr


def present_backends():
    _, out, _ = tovl("devices")
    words = [line.split() for line in out.splitlines() if not line.startswith(" ")]
    return [w[0] for w in words if len(w) > 1 and w[1] == "present:"]


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in header.items() if k != "__metadata__"}


def junit_counts(path):
    """{backend: (tests, failures, skipped, [(name, message)] of failures)} from a JUnit file."""
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites", root.tag
    out = {}
    for suite in root.findall("testsuite"):
        cases = suite.findall("testcase")
        failed = [(c.get("name"), c.find("failure").get("message")) for c in cases if c.find("failure") is not None]
        skipped = [c for c in cases if c.find("skipped") is not None]
        check(int(suite.get("tests")) == len(cases) and int(suite.get("failures")) == len(failed)
              and int(suite.get("skipped")) == len(skipped),
              f"junit {suite.get('name')}: the testsuite's counts match its testcases")
        out[suite.get("name")] = (len(cases), len(failed), len(skipped), failed)
    return out


def json_counts(path):
    """{backend: (tests, failures, skipped)} from a --json file."""
    out = {}
    for r in json.load(open(path))["results"]:
        t, f, s = out.get(r["backend"], (0, 0, 0))
        out[r["backend"]] = (t + 1, f + (r["result"] == "failed"), s + (r["result"] == "skipped"))
    return out


def main():
    seed = int(os.environ.get("TOVL_TEST_SEED") or random.SystemRandom().randrange(1 << 63)) & ((1 << 63) - 1)
    print(f"cli_campaign: seed {seed} (replay with TOVL_TEST_SEED={seed})")
    rng = random.Random(seed)
    backends = present_backends()
    print(f"backends here: {' '.join(backends)}")
    check("cpu" in backends, "the cpu backend is present")
    work = tempfile.mkdtemp(prefix="tovl_campaign_")
    path = lambda name: os.path.join(work, name)  # noqa: E731
    golden = json.load(open(GOLDEN))
    cases = len(golden["digests"])

    # The shipped file is what the reference writes now.
    rc, out, err = tovl("conform", "--backend", "cpu", "--golden-out", path("golden.json"))
    check(rc == 0 and open(path("golden.json"), "rb").read() == open(GOLDEN, "rb").read(),
          f"--golden-out on the cpu writes {GOLDEN} byte for byte (if a case changed: bump "
          f"TOVL_CONFORM_SUITE_VERSION and write the file again; rc {rc}: {err.strip()})")

    # Every backend here against it, JSON and JUnit agreeing.
    rc, out, err = tovl("conform", "--against", GOLDEN, "--json", path("against.json"), "--junit", path("against.xml"))
    check(rc == 0, f"--against the shipped file passes on {' '.join(backends)}"
          + ("" if rc == 0 else f" (rc {rc}: {err.strip()}\n{out[-3000:]})"))
    report = json.load(open(path("against.json")))
    check(report["suite"] == golden["suite"] and report["seed"] == golden["seed"],
          f"the JSON names suite {golden['suite']} and seed {golden['seed']}")
    junit, counts = junit_counts(path("against.xml")), json_counts(path("against.json"))
    check(sorted(junit) == sorted(backends) == sorted(counts), f"a testsuite per backend: {sorted(junit)}")
    for b in backends:
        j = junit.get(b, (0, 0, 0, []))
        check(j[:3] == counts.get(b) and j[0] == cases and j[1] == 0,
              f"junit {b}: {j[:3]} tests, failures, skipped as the JSON's {counts.get(b)}, {cases} cases")

    # A fresh seed: the same digest on every backend, in the JSON and the --verbose lines.
    fresh = str(rng.randrange(1 << 63))
    rc, out, err = tovl("conform", "--seed", fresh, "--verbose", "--json", path("fresh.json"))
    check(rc == 0, f"conform --seed {fresh} passes on every backend" + ("" if rc == 0 else f" (rc {rc}):\n{out[-3000:]}"))
    digests = {}
    for r in json.load(open(path("fresh.json")))["results"]:
        if r["result"] != "skipped":
            digests.setdefault((r["kernel"], r["case"]), {})[r["backend"]] = r["sha256"]
    same = [k for k, d in digests.items() if len(set(d.values())) == 1 and len(d) == len(backends)]
    check(len(digests) == cases and len(same) == cases,
          f"seed {fresh}: {len(same)} of {cases} cases with one digest on all of {' '.join(backends)}")
    verbose = {(w[1], w[2], w[3]): w[5] for w in (line.split() for line in out.splitlines())
               if len(w) >= 7 and w[0] == "conform"}
    check(all(verbose.get((b, k[0], k[1])) == d[b] for k, d in digests.items() for b in d),
          "the --verbose lines carry the JSON's digests")

    # One digest changed: that case fails, named with kernel and buffer, nothing else.
    changed = json.loads(json.dumps(golden))
    victim = changed["digests"][rng.randrange(cases)]
    victim["sha256"] = "%064x" % rng.getrandbits(256)
    json.dump(changed, open(path("changed.json"), "w"))
    rc, out, err = tovl("conform", "--backend", "cpu", "--against", path("changed.json"), "--junit", path("changed.xml"))
    fails = [line for line in out.splitlines() if line.startswith("FAIL ")]
    want = f"FAIL cpu {victim['kernel']} {victim['case']}: {victim['buffer']}: sha256 "
    check(rc == 1 and len(fails) == 1 and fails[0].startswith(want),
          f"one changed digest fails {victim['kernel']} {victim['case']} alone (rc {rc}: {fails})")
    j = junit_counts(path("changed.xml")).get("cpu", (0, 0, 0, []))
    check(j[1] == 1 and j[3][0][0] == f"{victim['kernel']}/{victim['case']}" and j[3][0][1].startswith(victim["buffer"]),
          f"the JUnit file has that one failure, its buffer named: {j[3]}")

    # Bad golden files: exit 2, the fault named, nothing run.
    text = open(GOLDEN).read()

    def edited(name, content):
        with open(path(name), "w") as f:
            f.write(content)
        return path(name)

    without = json.loads(text)
    del without["digests"][rng.randrange(cases)]
    twice = json.loads(text)
    twice["digests"].append(twice["digests"][0])
    bad_hex = json.loads(text)
    bad_hex["digests"][0]["sha256"] = "XYZ"
    refused = [
        (["--against", GOLDEN, "--seed", str(int(golden["seed"]) + 1)], f"is for seed {golden['seed']}, not --seed"),
        (["--against", edited("suite.json", text.replace('"tovl-conform/', '"other-suite/'))], "is for suite 'other-suite/"),
        (["--against", edited("newer.json", text.replace('"tovl-conform/1"', '"tovl-conform/99"'))], "is from a newer suite"),
        (["--against", edited("older.json", text.replace('"tovl-conform/1"', '"tovl-conform/0"'))], "is for an older suite"),
        (["--against", edited("truncated.json", text[:len(text) * 2 // 3])], "is truncated"),
        (["--against", edited("not.json", "digests: none\n")], "is not JSON"),
        (["--against", edited("empty.json", "")], "is empty"),
        (["--against", edited("backend.json", text.replace('"backend":\t"cpu"', '"backend":\t"metal"'))],
         "unknown backend 'metal'"),
        (["--against", edited("missing.json", json.dumps(without))], "no digest of"),
        (["--against", edited("twice.json", json.dumps(twice))], "is given twice"),
        (["--against", edited("hex.json", json.dumps(bad_hex))], "is not 64 lowercase hex digits"),
        (["--against", path("no-such-file.json")], "cannot open golden file"),
        (["--against", GOLDEN, "--golden-out", path("x.json")], "exclude each other"),
    ]
    for args, message in refused:
        rc, out, err = tovl("conform", "--backend", "cpu", *args)
        check(rc == 2 and message in err and out == "", f"{' '.join(os.path.basename(a) for a in args)}: exit 2, "
              f"'{message}' (rc {rc}: {err.strip()})")

    # tovl run --digest on the serving demo's mixed batch, on every backend.
    spec = importlib.util.spec_from_file_location("serve_demo", SERVE_DEMO)
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    rc = subprocess.run([sys.executable, SERVE_DEMO, TOVL, "--out", work, "--seed", str(seed & 0xFFFFFFFF)],
                        capture_output=True, text=True).returncode
    check(rc == 0, "the serving demo wrote its mixed batch")
    runs = {}
    for b in backends:
        cmd = ["run", "--backend", b, "--base", demo.BASE, "--batch", path("batch.safetensors"),
               "--out", path(f"out-{b}.safetensors"), "--logits", "f32", "--digest"]
        for name in demo.ADAPTERS:
            cmd += ["--adapter", os.path.join(demo.FIXTURES, name, "adapter")]
        rc, out, err = tovl(*cmd)
        printed = {w[1]: w[2] for w in (line.split() for line in out.splitlines()) if len(w) == 3 and w[0] == "sha256"}
        tensors = read_safetensors(path(f"out-{b}.safetensors")) if rc == 0 else {}
        check(rc == 0 and sorted(printed) == ["embed", "logits"]
              and all(hashlib.sha256(tensors[k]).hexdigest() == v for k, v in printed.items()),
              f"run --digest on {b}: the SHA-256 of embed and logits as written (rc {rc}: {err.strip()})")
        runs[b] = printed
    check(len({json.dumps(d, sort_keys=True) for d in runs.values()}) == 1,
          f"run --digest: the same digests on {' '.join(runs)}")

    if not failures:
        shutil.rmtree(work)
    print(f"cli_campaign: {len(failures)} failed (seed {seed}{'' if not failures else '; files in ' + work})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
