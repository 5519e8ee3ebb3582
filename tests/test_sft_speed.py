"""benchmarks/sft_speed.py's runs: each in an environment of its own whose Ray folder is dropped after a clean exit
and kept, and named, after a failure or a timeout (benchmarks/run_env.py)."""

import sys
import tempfile
from pathlib import Path

from script_module import ROOT, load_script

sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports run_env from its own directory
sft_speed = load_script(Path("benchmarks/sft_speed.py"))

# a child that writes into its Ray folder as a Ray session would, then exits with the code it is given or hangs
CHILD = ("import os, pathlib, sys, time; pathlib.Path(os.environ['RAY_TMPDIR'], 'session_latest').mkdir(); "
         "time.sleep(30) if sys.argv[1] == 'hang' else sys.exit(int(sys.argv[1]))")


def test_a_clean_runs_ray_folder_is_dropped_and_a_failed_or_timed_out_ones_kept(tmp_path, monkeypatch, capsys):
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    folders, codes = {}, {}
    for outcome in ("0", "3", "hang"):
        env = sft_speed.child_env("cpu")
        folders[outcome] = Path(env["RAY_TMPDIR"])
        codes[outcome], _ = sft_speed.run([sys.executable, "-c", CHILD, outcome], tmp_path / f"{outcome}.log", env,
                                          timeout=3.0 if outcome == "hang" else 60.0)
    assert codes == {"0": 0, "3": 3, "hang": 124}
    assert len(set(folders.values())) == 3 and all(f.parent == tmp_path / "tmp" for f in folders.values())
    assert not folders["0"].exists()
    assert folders["3"].exists() and folders["hang"].exists()
    printed = capsys.readouterr().out
    assert f"Ray logs are kept in {folders['3']}" in printed and f"Ray logs are kept in {folders['hang']}" in printed
