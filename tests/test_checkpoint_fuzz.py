"""Seeded checkpoint fuzzing (tests/checkpoint_fuzz.py): every mutant of a fused file's header, config or data is a
one-line error naming the file, or a load that is exactly the original model (or, for a re-signed config edit,
the model that config declares) — never a crash, a hang, a huge allocation or a silently different model."""
import pytest
from checkpoint_fuzz import run_campaign

CASES = 800  # ~25 s on 2 shared cores; `python tests/checkpoint_fuzz.py --cases N --seed S` for longer campaigns
ACCEPTED = {"clean error", "equal load", "loaded as declared"}


@pytest.mark.slow
def test_fuzzed_checkpoints_fail_cleanly_or_load_exactly(tmp_path):
    result = run_campaign(str(tmp_path), CASES, seed=0, timeout=20.0)
    counts = result["counts"]
    print("fuzz classes per family:", counts, "slowest case:", f"{result['slowest_case_s']:.2f} s")
    assert not result["failures"], result["failures"][:10]
    for family, classes in counts.items():
        assert set(classes) <= ACCEPTED, (family, classes)
        # Every family really reached the checks (a mutator that produced only intact files would prove nothing).
        assert classes.get("clean error", 0) >= CASES // len(counts) // 2, (family, classes)
    assert counts["data"] == {"clean error": CASES // 4}  # every flipped data bit is caught by the checksum
    assert result["slowest_case_s"] < 5.0


def test_the_harness_classifies_a_crash_and_a_hang(tmp_path):
    """The fuzz test could not fail if the harness never reported a crash or a hang: both are simulated here."""
    from checkpoint_fuzz import Worker, make_base_files

    bases = make_base_files(str(tmp_path))
    worker = Worker(bases[:1])
    try:
        case = {"index": 0, "path": bases[0], "base": bases[0], "verify": True}
        assert worker.run(case, timeout=20.0)["kind"] == "equal load"
        crashed = worker.run({**case, "simulate": "crash"}, timeout=20.0)
        assert crashed["kind"] == "crash" and "exited with 3" in crashed["message"]
    finally:
        worker.close()
    worker = Worker(bases[:1])
    try:
        hung = worker.run({**case, "simulate": "hang"}, timeout=2.0)
        assert hung["kind"] == "hang" and "most recent call first" in hung["message"], hung  # its stacks, dumped
    finally:
        worker.close()
