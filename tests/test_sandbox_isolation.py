"""Code sandbox isolation: confinement of the file system (dir_fd escapes, reads of project data / home / system
files), correct programs that use the stdlib and numpy, the isolation probe, the refuse switch, sandbox-caused
failures labelled as such, the assert-mode pass integrity (verdicts written by the tests' own process), the write
quota and total cleanup (the seccomp filter and the library list: test_sandbox_seccomp.py)."""

import logging
import os
import secrets
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml

from rewards import sandbox, sandbox_os
from rewards.code_reward import code_reward
from rewards.compose import RewardComposer
from rewards.spec import RewardZero, SampleView
from rewards.sandbox import (
    SandboxIsolationError,
    SandboxLimits,
    probe_isolation,
    run_program,
)
from rl.trajectory import Trajectory

REPO = Path(__file__).resolve().parents[1]
BUNDLED_CODE = REPO / "rl" / "bundled" / "code.jsonl"
LIMITS = {"wall_s": 5.0, "cpu_s": 3, "memory_mb": 512}
ECHO_TESTS = {"type": "stdio", "cases": [{"input": "7\n", "output": "7\n"}]}
IS_ROOT = os.geteuid() == 0


def traj(program, tests, uid="u"):
    text = f"<think>plan</think>Here:\n```python\n{program}\n```\n"
    return Trajectory(uid=uid, group_id="g", domain="code", prompt_ids=[1], response_ids=np.zeros(3),
                      inference_logprobs=np.zeros(3), response_text=text, sample={"tests": tests})


def view(program, tests):
    answer = f"```python\n{program}\n```"
    return SampleView(response=answer, answer=answer, sample={"tests": tests}, finish_reason="stop",
                      num_response_tokens=10, domain="code", max_new_tokens=100)


def code_params(**over):
    params = {"mode": "fraction", **LIMITS, "output_bytes": 1 << 20, "max_procs": 8, "max_program_chars": 100_000,
              "network_namespace": True, "sandbox_uid_base": 60000}
    params.update(over)
    return params


def leftovers() -> list:
    guard = str(REPO / "rewards" / "sandbox_guard.py")
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and guard in " ".join(p.info["cmdline"] or []):
                out.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


@pytest.fixture(scope="module")
def composer():
    c = RewardComposer({"code": [{"name": "code", "weight": 1.0}]},
                       {"num_workers": 2, "code": {**LIMITS, "timeout_s": 60}}, 1024)
    yield c
    c.close()


@pytest.fixture(scope="module")
def isolation():
    return probe_isolation(SandboxLimits(**LIMITS))


@pytest.fixture
def fresh_probe(monkeypatch):
    """Forget probe results and "already logged" marks (and restore them afterwards)."""
    monkeypatch.setattr(sandbox, "_probe_cache", {})
    monkeypatch.setattr(sandbox, "_warned", set())


def os_only(program, stdin=""):
    """Run `program` with the OS layers only (the probe mode: no Python audit hook)."""
    return sandbox._execute(program, SandboxLimits(**LIMITS), stdin=stdin, mode="probe")


# ------------------------------------------------------------------------------------------------- the probe
def test_probe_reports_what_it_found(isolation):
    info = isolation
    assert {"os_level", "fs_isolated", "net_isolated", "layers", "checks", "description"} <= set(info)
    assert info["description"].startswith("code sandbox:")
    if info["os_level"]:
        checks = info["checks"]
        assert checks["read_outside"] != "allowed" and checks["dirfd_create_outside"] != "allowed"
        assert checks["tcp_connect"] not in ("allowed", "ECONNREFUSED")
        assert checks["proc_self_mem"] != "allowed"
        assert "OS-level isolation" in info["description"]
        if checks["read_stdlib"] != "allowed":  # e.g. no mount namespace and a Python under a 0700 dir
            assert "cannot read the Python installation" in info["description"]
        layers = info["layers"]
        assert layers["jail"] or layers["landlock"]
        if IS_ROOT:
            assert layers["uid_drop"] and checks["uid"] != 0
    else:
        assert "falling back" in info["description"]


def test_isolation_is_logged_once_at_first_use(fresh_probe, caplog):
    limits = SandboxLimits(**LIMITS)
    with caplog.at_level(logging.INFO, logger="rewards.sandbox"):
        assert run_program("print(1)", limits).stdout.strip() == "1"
        assert run_program("print(2)", limits).stdout.strip() == "2"
    records = [r for r in caplog.records if r.getMessage().startswith("code sandbox:")]
    assert len(records) == 1


@pytest.mark.skipif(not IS_ROOT, reason="the namespaces and the uid drop need root")
def test_probe_sees_each_layer_missing(fresh_probe, monkeypatch, isolation):
    if not isolation["os_level"]:
        pytest.skip("no OS-level isolation on this machine")
    monkeypatch.setenv(sandbox.DISABLE_ENV, "jail,landlock")
    info = probe_isolation(SandboxLimits(**LIMITS))
    assert not info["os_level"] and not info["fs_isolated"]
    assert not info["layers"]["jail"] and not info["layers"]["landlock"]
    assert "falling back to the Python-level audit hook" in info["description"]


# --------------------------------------------------------------------------------------- refuse switch
def test_forced_isolation_failure_with_refuse_switch_raises(fresh_probe, monkeypatch):
    monkeypatch.setenv(sandbox.DISABLE_ENV, "netns,jail,landlock")
    strict = SandboxLimits(**LIMITS, require_os_isolation=True)
    with pytest.raises(SandboxIsolationError, match="require_os_isolation.*refusing to run"):
        run_program("print(1)", strict)
    # ... through the code reward too (a part error with that message, not a silent 0)
    with pytest.raises(SandboxIsolationError, match="OS-level isolation"):
        code_reward(view("print(7)", ECHO_TESTS), code_params(require_os_isolation=True))
    # The guard refuses on its own as well, whatever the parent believed.
    with pytest.raises(SandboxIsolationError, match="isolation required but unavailable"):
        sandbox._execute("print(1)", strict, stdin="", mode="stdio")
    assert not leftovers()


def test_without_the_switch_the_fallback_runs_with_a_warning(fresh_probe, monkeypatch, caplog):
    monkeypatch.setenv(sandbox.DISABLE_ENV, "jail,landlock")
    with caplog.at_level(logging.WARNING, logger="rewards.sandbox"):
        res = run_program("print(1 + 1)", SandboxLimits(**LIMITS))
    assert res.status == "ok" and res.stdout.strip() == "2"
    assert any("falling back" in r.getMessage() for r in caplog.records)
    # The Python-level guard still refuses directory handles outside the box (no dir_fd escape).
    name = f"mixrl_fallback_{uuid.uuid4().hex}"
    res = run_program(f"import os\nfd = os.open('/tmp', os.O_RDONLY)\nos.mkdir({name!r}, dir_fd=fd)",
                      SandboxLimits(**LIMITS))
    assert res.status == "forbidden" and not os.path.exists(f"/tmp/{name}")


# ------------------------------------------------------------------------------- file-system confinement
def dirfd_programs(name):
    write = (f"import os\nfd = os.open('/tmp', os.O_RDONLY)\n"
             f"os.close(os.open({name!r}, os.O_CREAT | os.O_WRONLY, dir_fd=fd))\nprint(7)")
    mkdir = f"import os\nfd = os.open('/tmp', os.O_RDONLY)\nos.mkdir({name!r}, dir_fd=fd)\nprint(7)"
    return {"write": write, "mkdir": mkdir}


@pytest.mark.parametrize("kind", ["write", "mkdir"])
def test_dir_fd_escape_scores_zero_stdio_and_assert(composer, kind):
    name = f"mixrl_escape_{uuid.uuid4().hex}"
    program = dirfd_programs(name)[kind]
    stdio = traj(program, ECHO_TESTS, f"s{kind}")
    asserted = traj(program + "\ndef f(x):\n    return x", {"type": "assert", "code": "assert f(1) == 1"}, f"a{kind}")
    composer.score([stdio, asserted])
    for t in (stdio, asserted):
        assert t.reward == 0.0, t.reward_error
        assert t.reward_error is not None and "forbidden" in t.reward_error
    assert not os.path.exists(f"/tmp/{name}")
    assert not leftovers()


@pytest.mark.parametrize("kind", ["write", "mkdir"])
def test_dir_fd_escape_is_stopped_by_the_os_layer_alone(isolation, kind):
    if not isolation["fs_isolated"]:
        pytest.skip("no OS-level file-system isolation on this machine")
    name = f"mixrl_escape_{uuid.uuid4().hex}"
    res = os_only(dirfd_programs(name)[kind])
    assert res.status != "ok" and "7" not in res.stdout
    assert not os.path.exists(f"/tmp/{name}")


@pytest.fixture
def home_canary():
    path = Path.home() / f".mixrl-sandbox-canary-{uuid.uuid4().hex}"
    secret = secrets.token_hex(8)
    path.write_text(secret + "\n")
    os.chmod(path, 0o644)
    yield path, secret
    path.unlink()


def secret_files(home_canary):
    """(path, a token of its content the program would print) for files the program must not read."""
    rows = [(BUNDLED_CODE, BUNDLED_CODE.read_text().split()[0]), (home_canary[0], home_canary[1])]
    bashrc = Path.home() / ".bashrc"
    if bashrc.is_file() and bashrc.read_text(errors="replace").split():
        rows.append((bashrc, bashrc.read_text(errors="replace").split()[0]))
    rows.append((Path("/etc/shadow"), "root"))
    return rows


def test_secret_files_are_not_readable(composer, home_canary):
    trajs = []
    for k, (path, token) in enumerate(secret_files(home_canary)):
        program = f"print(open({str(path)!r}, errors='replace').read().split()[0])"
        trajs.append(traj(program, {"type": "stdio", "cases": [{"input": "", "output": token}]}, f"r{k}"))
        reader = f"def f():\n    return open({str(path)!r}, errors='replace').read().split()[0]"
        trajs.append(traj(reader, {"type": "assert", "code": f"assert f() == {token!r}"}, f"a{k}"))
    composer.score(trajs)
    assert [t.reward for t in trajs] == [0.0] * len(trajs), [(t.uid, t.reward_error) for t in trajs]
    assert not leftovers()


def test_secret_files_are_not_readable_by_the_os_layer_alone(isolation, home_canary):
    if not isolation["fs_isolated"]:
        pytest.skip("no OS-level file-system isolation on this machine")
    for path, token in secret_files(home_canary):
        res = os_only(f"print(open({str(path)!r}, errors='replace').read().split()[0])")
        assert res.status != "ok" and token not in res.stdout, path
    # Nor listed: the project dir and the home dir (at most the path to the interpreter shows in the jail).
    for d, name in ((REPO, "rewards"), (Path.home(), home_canary[0].name)):
        res = os_only(f"import os\nprint(os.listdir({str(d)!r}))")
        assert name not in res.stdout, (d, res.stdout)


# --------------------------------------------------------------------------------- correct programs pass
GOOD = {
    "namedtuple": "from collections import namedtuple\nP = namedtuple('P', 'a b')\ndef f(x):\n    return P(x, 1).a",
    "functional enum": "from enum import Enum\nC = Enum('C', 'A B')\ndef f(x):\n    return x + C.A.value - 1",
    "typevar": "from typing import Generic, TypeVar\nT = TypeVar('T')\nclass Box(Generic[T]):\n"
               "    def __init__(self, v: T):\n        self.v = v\ndef f(x):\n    return Box(x).v",
    "numpy": "import numpy as np\ndef f(x):\n    return int(np.array([x]).sum())",
    "stdlib modules": "import signal, graphlib, pickle, logging, unittest, gzip\n"
                      "def f(x):\n    return pickle.loads(gzip.decompress(gzip.compress(pickle.dumps(x))))",
    "asyncio": "import asyncio\nasync def g(x):\n    return x\ndef f(x):\n    return asyncio.run(g(x))",
    "pickle own class": "import pickle\nclass A:\n    def __init__(self, v):\n        self.v = v\n"
                        "def f(x):\n    return pickle.loads(pickle.dumps(A(x))).v",
    "logging and traceback": "import logging, traceback\ndef f(x):\n    logging.getLogger('p').info('x=%s', x)\n"
                             "    try:\n        1 / 0\n    except ZeroDivisionError:\n        traceback.format_exc()\n"
                             "    return x",
}


@pytest.mark.parametrize("name", list(GOOD))
def test_correct_programs_pass(composer, isolation, name):
    if name == "asyncio" and isolation.get("interp_ok") is False:
        pytest.skip("the sandbox uid cannot read the Python installation here: asyncio is not preloaded")
    program = GOOD[name]
    stdio = traj(program + "\nprint(f(int(input())))", ECHO_TESTS, f"s-{name}")
    asserted = traj(program, {"type": "assert", "code": "assert f(3) == 3\nassert f(5) == 5"}, f"a-{name}")
    composer.score([stdio, asserted])
    assert (stdio.reward, asserted.reward) == (1.0, 1.0), (stdio.reward_error, asserted.reward_error)


@pytest.mark.skipif(not IS_ROOT, reason="the uid drop only happens as root")
def test_failure_caused_by_the_sandbox_is_labelled(fresh_probe, monkeypatch, composer):
    stdlib = sandbox.host_paths(("numpy",))["stdlib"][0]
    if sandbox_os.others_can_reach(stdlib):
        pytest.skip("the interpreter is readable by any uid here: nothing for the sandbox to break")
    # Without the mount namespace the sandbox uid cannot read a Python under a 0700 directory: a stdlib module
    # that was not imported beforehand is then missing because of the sandbox, and the result says so. It is still
    # a zero, not an abstention: what says so is the program's stderr, which a program can write itself.
    monkeypatch.setenv(sandbox.DISABLE_ENV, "jail")
    t = composer.score([traj("import zoneinfo\nprint(7)", ECHO_TESTS, "lab")])[0]
    assert t.reward == 0.0 and not t.reward_failed
    assert "unavailable" in t.reward_error and "zoneinfo" in t.reward_error


# ------------------------------------------------------------------------------- assert-mode pass integrity
DOUBLE = ["assert f(1) == 2", "assert f(2) == 4", "assert f(3) == 6"]
FORGERS = {
    "driver consts via f_back": "import sys\nd = sys._getframe().f_back\nprint(d.f_code.co_consts)\n"
                                "def f(x):\n    return 0",
    "driver consts from a test": "import sys\ndef f(x):\n    print(sys._getframe(1).f_back.f_code.co_consts)\n"
                                 "    return 0",
    "driver via a traceback": "def f(x):\n    try:\n        raise ValueError\n    except ValueError as e:\n"
                              "        print(e.__traceback__.tb_frame.f_back.f_back.f_code)\n    return 0",
    "every descriptor": "import os\ndef f(x):\n    for fd in range(3, 64):\n        try:\n"
                        "            os.write(fd, b'PASS 0 0\\nPASS 1 0\\nPASS 2 0\\n')\n"
                        "            print(os.pread(fd, 200, 0))\n        except OSError:\n            pass\n"
                        "    return 0",
    "process memory": "def f(x):\n    print(open('/proc/self/mem', 'rb'))\n    return 0",
    "gc walk": "import gc\ndef f(x):\n    print(len(gc.get_objects()))\n    return 0",
    "ctypes": "import ctypes\ndef f(x):\n    print(ctypes.string_at(id(x), 8))\n    return 0",
    "sub-interpreter": "import _xxsubinterpreters\ndef f(x):\n    return 0",
    "exit before asserts": "import os\nos._exit(0)",
}


@pytest.mark.parametrize("name", list(FORGERS))
def test_program_cannot_forge_passes(name):
    res = run_program(FORGERS[name], SandboxLimits(**LIMITS), asserts=DOUBLE)
    assert res.passed == set(), (res.status, res.detail, res.stdout[:300])
    assert "PASS" not in res.stdout


def test_frames_and_locals_of_the_driver_hold_no_secret():
    # Walking up the frames (allowed: the stdlib needs it) shows nothing that could forge a pass.
    program = ("import sys\nseen = []\ndef f(x):\n    fr = sys._getframe()\n    while fr is not None:\n"
               "        seen.append(repr(sorted(k for k in fr.f_locals if not k.startswith('__'))))\n"
               "        fr = fr.f_back\n    return 2 * x")
    res = run_program(program + "\nimport atexit", SandboxLimits(**LIMITS),
                      asserts=DOUBLE[:2] + ["print(seen)\nassert f(3) == 6"])
    assert res.passed == {0, 1, 2}, (res.status, res.detail)
    assert "PASS" not in res.stdout and "nonce" not in res.stdout


# ------------------------------------------------------------------------------- write quota, total cleanup
# Built from the bottom up (each new top takes the tree so far), so no step walks a long path.
DEEP_TREE = ("import os\nfor i in range(5000):\n    os.mkdir(f'n{i}')\n    if i:\n"
             "        os.rename(f'n{i - 1}', f'n{i}/d')\nprint('built')")
SLOW = {**LIMITS, "wall_s": 30.0, "cpu_s": 20}  # both end at the quota long before; room for a loaded machine
WRITE_FOREVER = "i = 0\nwhile True:\n    with open(f'f{i}', 'wb') as f:\n        f.write(b'x' * 500_000)\n    i += 1"
BOX_MODES = {"tmpfs box": "", "box on the host disk": "jail"}


@pytest.fixture
def temp_root(monkeypatch):
    """A temp root of the sandbox's own (world-traversable, like /tmp), to see what a run leaves in it."""
    root = Path(tempfile.mkdtemp(prefix="mixrl-test-root-"))
    os.chmod(root, 0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    yield root
    monkeypatch.undo()
    subprocess.run(["rm", "-rf", str(root)], check=False)


def left_in(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name != "mixrl-sandbox-uids")


@pytest.mark.parametrize("mode", list(BOX_MODES))
def test_a_deep_tree_is_removed_and_reported_as_the_quota(fresh_probe, monkeypatch, temp_root, mode):
    monkeypatch.setenv(sandbox.DISABLE_ENV, BOX_MODES[mode])
    res = run_program(DEEP_TREE, SandboxLimits(**SLOW))
    assert res.status == "write_limit", (res.status, res.detail, res.stderr_tail[-300:])
    assert left_in(temp_root) == []
    assert not leftovers()


@pytest.mark.parametrize("mode", list(BOX_MODES))
def test_writing_past_the_quota_stops_the_run(fresh_probe, monkeypatch, temp_root, mode):
    monkeypatch.setenv(sandbox.DISABLE_ENV, BOX_MODES[mode])
    t0 = time.monotonic()
    res = run_program(WRITE_FOREVER, SandboxLimits(**SLOW, max_write_mb=4))
    assert res.status == "write_limit", (res.status, res.detail, res.stderr_tail[-300:])
    assert time.monotonic() - t0 < SLOW["wall_s"]  # stopped at the quota, not at the time limit
    assert left_in(temp_root) == []
    # The config key reaches the sandbox: rewards.code.max_write_mb -> the code reward's params -> SandboxLimits.
    with pytest.raises(RewardZero, match="write_limit"):
        code_reward(view(WRITE_FOREVER, ECHO_TESTS), code_params(**SLOW, max_write_mb=4))
    assert left_in(temp_root) == []
    assert not leftovers()


def odd_tree(root: str) -> None:
    """Everything a cleanup can trip on: depth past the recursion limit, odd names, unreadable and read-only dirs,
    files chmod 000, a fifo, a socket, a symlink out of the tree."""
    fd = os.open(root, os.O_RDONLY)
    for _ in range(3000):
        os.mkdir("d", dir_fd=fd)
        sub = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = sub
    os.close(fd)
    os.mkdir(f"{root}/ro")
    Path(f"{root}/ro/secret").write_bytes(b"x" * 10_000)
    os.chmod(f"{root}/ro/secret", 0)
    os.chmod(f"{root}/ro", 0o500)
    os.makedirs(f"{root}/locked/inner")
    os.chmod(f"{root}/locked", 0)
    os.mkfifo(f"{root}/fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(f"{root}/sock")
    sock.close()
    Path(os.path.join(root, "new\nline \udcff")).write_text("x")
    os.symlink("/etc", f"{root}/to-etc")


@pytest.mark.parametrize("who", ["this uid", "an unprivileged owner"])
def test_remove_tree_removes_anything(tmp_path, who):
    from rewards.sandbox_fs import remove_tree

    if who == "this uid":
        root = tmp_path / "tree"
        root.mkdir()
        odd_tree(str(root))
        remove_tree(str(root))
        assert not root.exists() and os.path.isdir("/etc")
        return
    if not IS_ROOT:
        pytest.skip("needs root to become another uid")
    parent = Path(tempfile.mkdtemp(prefix="mixrl-rmtest-"))
    try:
        os.chmod(parent, 0o777)
        root = parent / "tree"
        pid = os.fork()
        if pid == 0:  # the owner, without root's override of permissions, builds and removes its own tree
            code = 1
            try:
                os.setgid(65534)
                os.setuid(65534)
                os.mkdir(root)
                odd_tree(str(root))
                remove_tree(str(root))
                code = 0 if not root.exists() else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0 and not root.exists()
    finally:
        subprocess.run(["rm", "-rf", str(parent)], check=False)


def test_sandbox_limits_from_config():
    limits = sandbox.sandbox_limits_from_config(
        {"mode": "fraction", "wall_s": 3, "network_namespace": False, "sandbox_uid_base": 61000, "packages": [],
         "max_write_mb": 4, "require_os_isolation": True, "timeout_s": 60}, memory_mb=256)
    assert (limits.wall_s, limits.netns, limits.uid_base, limits.packages) == (3.0, False, 61000, ())
    assert (limits.max_write_mb, limits.require_os_isolation, limits.memory_mb) == (4, True, 256)
    assert sandbox.sandbox_limits_from_config(None) == SandboxLimits()
    # From the config file through the code reward's validated params.
    from rewards.compose import build_domain_parts

    code_cfg = yaml.safe_load((REPO / "conf" / "rewards" / "default.yaml").read_text())["code"]
    for section, want in ((code_cfg, (32, ("numpy",))), ({**code_cfg, "max_write_mb": 4, "packages": []}, (4, ()))):
        (part,) = build_domain_parts("code", [{"name": "code", "weight": 1.0}], {"code": section}, 1024)
        limits = sandbox.sandbox_limits_from_config(part.params)
        assert (limits.max_write_mb, limits.packages) == want
