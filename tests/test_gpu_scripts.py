"""The prepared GPU scripts (benchmarks/gpu_check_*.sh) select the tests they are meant to run.

A GPU is lent to a session only now and then, for minutes: a renamed test that a script's `-k` expression no longer
matches, or a node id that no longer exists, would silently drop a native check from the one run that could make
it.  Here every pytest call of the scripts with literal test paths is collected (no GPU needed: the CUDA-only tests
are collected, not run), and the diagnoses the block path's next run depends on are required by name."""
import glob
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# pytest options of the scripts that take a value (dropped with it)
VALUED = {"-n", "-p", "-k", "-m", "--tb"}
# Tests `bash benchmarks/gpu_check_profile.sh` (call 1 of the next GPU run) must run natively.
CALL_1_MUST_RUN = [
    "tests/test_ln_linear_triton.py::test_every_candidate_gives_the_reference[qkv]",
    "tests/test_ln_linear_triton.py::test_every_candidate_gives_the_reference[fc2]",
    "tests/test_ln_linear_triton.py::test_cuda_split_k_race_free_and_deterministic[torch.bfloat16]",
    "tests/test_ln_linear_triton.py::test_kept_colsum_matches_the_in_kernel_sum[2-torch.bfloat16]",
    "tests/test_attention_triton.py::test_every_candidate_gives_the_reference[torch.bfloat16]",
]


def _pytest_calls(path):
    """(-k expression or None, [files and node ids]) of each pytest call in a shell script."""
    with open(path) as f:
        text = f.read().replace("\\\n", " ")
    calls = []
    for line in text.splitlines():
        if "pytest" not in line or line.lstrip().startswith("#"):
            continue
        tokens = shlex.split(line, comments=True)
        args = tokens[tokens.index("pytest") + 1:]
        expr, targets, i = None, [], 0
        while i < len(args):
            a = args[i]
            if a in (">", "2>&1", "|", "&", "&&", ";") or a.startswith(">"):
                break
            if a == "-k":
                expr = args[i + 1]
            if a in VALUED:
                i += 2
                continue
            if a.startswith("tests/") and "$" not in a:
                targets.append(a)
            i += 1
        if targets:
            calls.append((expr, targets))
    return calls


_COLLECT = r"""
import json, sys
import pytest

class Selected:
    def pytest_collection_finish(self, session):
        self.ids = [item.nodeid for item in session.items]

out = []
for expr, targets in json.loads(sys.argv[1]):
    plugin = Selected()
    args = ["--collect-only", "-q", "-p", "no:cacheprovider", *targets] + (["-k", expr] if expr is not None else [])
    code = pytest.main(args, plugins=[plugin])
    out.append({"code": int(code), "ids": getattr(plugin, "ids", [])})
print("RESULT " + json.dumps(out))
"""


def _collect_all(calls):
    """The node ids each (expr, targets) call selects, collected in one process (test modules import once)."""
    proc = subprocess.run([sys.executable, "-c", _COLLECT, json.dumps(calls)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, check=False)
    line = next((line for line in proc.stdout.splitlines() if line.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line is not None, proc.stdout[-3000:] + proc.stderr[-2000:]
    results = json.loads(line[len("RESULT "):])
    for (expr, targets), result in zip(calls, results):
        assert result["code"] in (0, 5), f"pytest {targets} -k {expr!r}: collection failed (exit {result['code']})"
    return [result["ids"] for result in results]


SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "gpu_check*.sh")))


@pytest.mark.slow
def test_gpu_scripts_select_tests_in_every_file_they_name():
    calls = {os.path.basename(s): _pytest_calls(s) for s in SCRIPTS}
    flat = [(script, expr, targets) for script, cs in calls.items() for expr, targets in cs]
    selected = _collect_all([[expr, targets] for _, expr, targets in flat])
    for (script, expr, targets), ids in zip(flat, selected):
        for target in targets:
            prefix = target if "::" in target else target + "::"
            assert any(i.startswith(prefix) for i in ids), f"{script}: `pytest -k {expr!r}` selects nothing in {target}"
    profile = [ids for (script, _, _), ids in zip(flat, selected) if script == "gpu_check_profile.sh"]
    missing = [t for t in CALL_1_MUST_RUN if not any(t in ids for ids in profile)]
    assert not missing, f"gpu_check_profile.sh no longer runs {missing}"


def test_the_script_parser_reads_options_and_targets(tmp_path):
    script = tmp_path / "s.sh"
    script.write_text('run 60 t env A=0 python3 -m pytest -q -n 8 -p no:cacheprovider --tb=short \\\n'
                      '  -k "cuda or every_candidate" tests/a.py tests/b.py > "$OUT/t.txt" 2>&1\n'
                      'python3 -m pytest -q tests/c.py\n'
                      'python3 -m pytest "tests/d.py::test_x" "tests/test_${t}_triton.py"\n')
    assert _pytest_calls(script) == [("cuda or every_candidate", ["tests/a.py", "tests/b.py"]), (None, ["tests/c.py"]),
                                     (None, ["tests/d.py::test_x"])]
    assert re.fullmatch(r"gpu_check.*\.sh", os.path.basename(SCRIPTS[0]))
