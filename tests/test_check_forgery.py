"""A block written to fool the checker gets the verdict its answers earn, never a forged one.

Each block below computes the lessons' block without the 1/sqrt(hs) scale (``no_scaling``) and
tries one trick to get ``result: PASS`` anyway. ``gptblock check`` runs as a real process, so
that what the block writes to file descriptor 1, to the checker's ``/proc/PID/fd/1`` or from an
``atexit`` handler would land in the very stdout a grader reads. Every trick must end in the
verdict its answers earn (``FAIL``, exit 1; ``UNVERIFIED``, exit 3, for a block that will not be
read), one ``result:`` line, the checker's, and ``--json`` one object; what the block printed
is only counted (a note may quote its first line, inside the note).
"""

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time

import pytest

from gptblock.check import check_isolated

FORGED = "FORGED-VERDICT"

BLOCKS = textwrap.dedent(
    f'''
    import atexit, copy, gc, json, math, os, sys, time
    import torch, torch.nn as nn
    from torch.nn import functional as F

    FORGED = "{FORGED}"
    REPORT = {{"target": "x", "findings": [], "diagnosis": [], "passed": True, "verdict": "PASS"}}


    class NoScale(nn.Module):
        """The lessons' block, but its attention scores are not scaled by 1/sqrt(hs)."""

        scaled = False

        def __init__(self, n_embd, n_head):
            super().__init__()
            self.n_head = n_head
            self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
            self.qkv, self.proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
            self.fc1, self.fc2 = nn.Linear(n_embd, 4 * n_embd), nn.Linear(4 * n_embd, n_embd)

        def attn(self, h, scaled):
            B, T, C = h.shape
            q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in self.qkv(h).chunk(3, -1))
            wei = q @ k.transpose(-2, -1) * (k.shape[-1] ** -0.5 if scaled else 1.0)
            wei = wei.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            return self.proj((wei.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C))

        def forward(self, x):
            x = x + self.attn(self.ln1(x), self.scaled)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


    def _say_pass():
        """Everything a block could write where the report goes."""
        text = f"result: PASS {{FORGED}}\\n" + json.dumps({{**REPORT, "note": FORGED}}) + "\\n"
        print(text, flush=True)
        for fd in (1, 2):
            try:
                os.write(fd, text.encode())
            except OSError:
                pass
        pid = int(os.readlink("/proc/self"))  # as /proc numbers it: not in a PID namespace
        while pid > 1:  # up the process tree: the checker's stdout, if it can be opened
            for fd in (1, 2):
                try:
                    with open(f"/proc/{{pid}}/fd/{{fd}}", "w") as f:
                        f.write(text)
                except OSError:
                    pass
            try:
                pid = int(open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                break


    class PatchesTheChecker(NoScale):
        """Trick 1: replace the checker's functions, in its own process, by ones that say PASS."""

        def __init__(self, n_embd, n_head):
            super().__init__(n_embd, n_head)
            import gptblock.check as check
            from gptblock.check.mistakes import report, search
            from gptblock.check.compare import probes
            from gptblock.check.isolation import worker as served
            report.CheckReport.verdict = property(lambda self: "PASS")
            report.CheckReport.passed = property(lambda self: True)
            for name in list(probes.PROBES):
                probes.PROBES[name] = lambda s: probes.ProbeResult(True, FORGED)
            search.TOLERANCE = float("inf")
            for module in list(sys.modules.values()):
                if getattr(module, "__name__", "").startswith("gptblock.check"):
                    for attr in ("decide", "check_in_process", "_check"):
                        if hasattr(module, attr):
                            setattr(module, attr, lambda *a, **k: report.CheckReport(FORGED, []))


    class SendsItsOwnReport(NoScale):
        """Trick 2: walk the stack to the worker's pipe and send a report, and answers, of its own."""

        def forward(self, x):
            from gptblock.check.serve import loop
            frame = sys._getframe()
            while frame is not None:
                out_fd = frame.f_locals.get("out_fd")
                header = frame.f_locals.get("header")
                if isinstance(out_fd, int) and isinstance(header, dict):
                    wanted = header.get("id")
                    report = {{"event": "report", "report": REPORT, "nonce": "0"}}
                    os.write(out_fd, (json.dumps(report) + "\\n").encode())
                    loop.send(out_fd, {{"id": wanted, "ok": {{"verdict": "PASS"}}}})
                    loop.send(out_fd, {{"id": wanted + 1, "ok": {{"how": "switched off"}}}})
                frame = frame.f_back
            for fd in range(3, 64):  # and to every descriptor it has
                try:
                    os.write(fd, (json.dumps({{"id": 1, "ok": REPORT}}) + "\\n").encode())
                except OSError:
                    pass
            return super().forward(x)


    class PrintsAtExit(NoScale):
        """Trick 3: a PASS printed by an atexit handler, by os.write(1, ...), and into the checker's
        own /proc/PID/fd/1, at import, while checked and at exit."""

        def __init__(self, n_embd, n_head):
            super().__init__(n_embd, n_head)
            atexit.register(_say_pass)
            _say_pass()

        def forward(self, x):
            _say_pass()
            return super().forward(x)


    class RightOnlyWhenWatched(NoScale):
        """Trick 4: the right block for the inputs it expects the checker to compare (any batch
        that differs from the length: the traced input), the mistake everywhere else."""

        def forward(self, x):
            type(self).scaled = x.shape[0] != x.shape[1]
            return super().forward(x)


    class PatchesTorch(NoScale):
        """Trick 5: torch's comparisons, in its process, always say equal."""

        def __init__(self, n_embd, n_head):
            super().__init__(n_embd, n_head)
            torch.allclose = lambda *a, **k: True
            torch.equal = lambda *a, **k: True
            torch.isfinite = lambda t: torch.ones_like(t, dtype=torch.bool)
            torch.Tensor.__eq__ = lambda a, b: torch.ones_like(a, dtype=torch.bool)


    def _forge_traces(forge):
        """Have the child's recorder send ``forge(honest, module, x)`` for each trace: the
        weights are read in the checker's process from the traces the block's process sends."""
        for main in _loops():  # the request loop
            honest = getattr(main, "honest_record", main.record)  # built again at other sizes:
            main.honest_record = honest  # forge the honest recorder's, not the last forgery's
            main.record = lambda module, x, honest=honest, **kwargs: forge(
                lambda m, y: honest(m, y, **kwargs), module, x
            )


    def _loops():
        """The modules of the process's request loop (the one whose ``record`` it calls)."""
        return [m for m in list(sys.modules.values()) if {{"drive_cache", "Held"}} <= set(vars(m))]


    class ForgesItsWeights(NoScale):
        """Trick 6: traces of another block (the lessons' own, freshly built) sent as its own."""

        def __init__(self, n_embd, n_head):
            super().__init__(n_embd, n_head)
            from gptblock import lesson

            other = lesson.Block(n_embd, n_head, 16, dropout=0.0).double().eval()
            _forge_traces(lambda honest, module, x: honest(other, x))


    class WithholdsItsWeights(NoScale):
        """Trick 7: say the weights cannot be read, so that only the black-box checks speak."""

        def __init__(self, n_embd, n_head):
            super().__init__(n_embd, n_head)
            from gptblock.check.isolation import worker as served

            _forge_traces(lambda honest, module, x: ({{"error": FORGED}}, {{}}))
            served.Served.read = lambda self, roles: ({{"why": FORGED, "notes": []}}, {{}})
            served.readings.suggest_map = lambda module, C: "result: PASS " + FORGED


    class RescalesItsWeights(NoScale):
        """Trick 8: traces of itself with q's weights times sqrt(hs), with which the lessons'
        block computes exactly what this one does: PASS, were the weights read not checked
        against the values the checker gave it."""

        def __init__(self, n_embd, n_head):
            super().__init__(n_embd, n_head)
            root = math.sqrt(n_embd // n_head)

            def forge(honest, module, x):
                other = copy.deepcopy(module)
                with torch.no_grad():
                    other.qkv.weight[:n_embd] *= root
                    other.qkv.bias[:n_embd] *= root
                return honest(other, x)

            _forge_traces(forge)


    class OneNorm(NoScale):
        """The lessons' block (scaled), but with one LayerNorm for both branches."""

        scaled = True

        def __init__(self, n_embd, n_head):
            super().__init__(n_embd, n_head)
            del self.ln2

        def forward(self, x):
            x = x + self.attn(self.ln1(x), True)
            return x + self.fc2(F.gelu(self.fc1(self.ln1(x))))


    class CopiesItsNorm(OneNorm):
        """Trick 9: traces of itself with a copy of ln1 as ln2 before the MLP, so that the block
        reads as having two norms."""

        def __init__(self, n_embd, n_head):
            super().__init__(n_embd, n_head)

            class TwoNorms(NoScale):
                scaled = True

            def forge(honest, module, x):
                other = copy.deepcopy(module)
                other.ln2 = copy.deepcopy(other.ln1)
                other.__class__ = TwoNorms
                return honest(other, x)

            _forge_traces(forge)


    class SendsBadTensors(NoScale):
        """Trick 10: outputs that are not the block's: a wrong shape and NaN sent as the answer."""

        def __init__(self, n_embd, n_head):
            super().__init__(n_embd, n_head)
            for loop in _loops():  # its answers to ``forward``
                honest = loop.Held.answer
                loop.Held.answer = lambda held, op, *a, honest=honest: (
                    ({{"shape": [1], "dtype": "float64", "device": "same"}},
                     {{"y": torch.full((2,), float("nan"), dtype=torch.float64)}})
                    if op == "forward" else honest(held, op, *a)
                )


    class SpoilsTheNext(NoScale):
        """Trick 11: patch the checker's copy, in its process, for the targets checked after it."""

        def __init__(self, n_embd, n_head):
            super().__init__(n_embd, n_head)
            from gptblock.check.serve import subject

            subject.Subject.__call__ = lambda self, x, seeded=True: torch.zeros_like(x)


    class LeavesADaemon(NoScale):
        """Trick 12: a process in a new session, forked twice, that outlives a hung check."""

        def forward(self, x):
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    open(__file__ + ".daemon", "w").write(os.readlink("/proc/self"))  # /proc's pid
                    time.sleep(300)
                os._exit(0)
            time.sleep(300)
    '''
)


@pytest.fixture(scope="module")
def blocks(tmp_path_factory):
    path = tmp_path_factory.mktemp("forgery") / "blocks.py"
    path.write_text(BLOCKS)
    return path


def _check(target, *flags):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(
        [sys.executable, "-m", "gptblock", "check", target, *flags],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_the_block_fails_without_a_trick(blocks):
    done = _check(f"{blocks}:NoScale")
    assert done.returncode == 1 and "diagnosis: no_scaling" in done.stdout, done.stdout


@pytest.mark.parametrize(
    "name, code, why",
    [
        ("PatchesTheChecker", 1, "diagnosis: no_scaling"),
        ("SendsItsOwnReport", 1, "broke the checker's protocol"),
        ("PrintsAtExit", 1, "diagnosis: no_scaling"),
        ("RightOnlyWhenWatched", 1, "but not on a fresh"),
        # its own broken torch garbles its reading, more or less with the weights drawn
        ("PatchesTorch", (1, 3), ("diagnosis: no_scaling", "weights not read")),
        ("ForgesItsWeights", 3, "the weights read for q are not the values"),
        ("WithholdsItsWeights", 3, "weights not read, black-box results only"),
        ("SendsBadTensors", 1, "broke the checker's protocol"),
        ("RescalesItsWeights", 3, "the weights read for q are not the values"),
        ("CopiesItsNorm", 3, "ln1 and ln2 were read from the same parameters"),
        ("OneNorm", 1, "diagnosis: shared_norm"),  # without the trick
    ],
)
def test_a_trick_gets_its_true_verdict_and_nothing_forged_on_stdout(blocks, name, code, why):
    """FAIL (exit 1); a block whose weights cannot be read, or are misreported, is UNVERIFIED
    (exit 3): the black-box checks pass, and it was not compared."""
    done = _check(f"{blocks}:{name}")
    codes, whys = (code, why) if isinstance(code, tuple) else ((code,), (why,))
    assert done.returncode in codes, (done.stdout, done.stderr)
    verdict = {1: "result: FAIL", 3: "result: UNVERIFIED"}[done.returncode]
    results = [line for line in done.stdout.splitlines() if line.startswith("result")]
    assert results and results[0].startswith(verdict), done.stdout
    assert any(w in done.stdout for w in whys), done.stdout
    assert len(results) == 1  # the checker's, and nothing the block wrote starts a line
    assert not any(line.startswith(("{", FORGED)) for line in done.stdout.splitlines())
    assert done.stderr == "", done.stderr  # a verdict is no error: nothing on stderr


@pytest.mark.parametrize("name", ["PatchesTheChecker", "PrintsAtExit", "SendsItsOwnReport"])
def test_json_output_is_one_object_with_the_checkers_verdict(blocks, name):
    done = _check(f"{blocks}:{name}", "--json")
    data = json.loads(done.stdout)  # one JSON object: nothing the block wrote is mixed in
    assert done.returncode == 1 and data["passed"] is False
    assert data["reports"][0]["verdict"] == "FAIL"


def test_a_process_in_a_new_session_does_not_outlive_the_timeout(blocks):
    started = time.monotonic()
    done = _check(f"{blocks}:LeavesADaemon", "--timeout", "3")
    assert done.returncode == 1 and "did not finish within 3 s (--timeout)" in done.stdout
    assert time.monotonic() - started < 120
    pid = int(pathlib.Path(f"{blocks}.daemon").read_text())
    stat = pathlib.Path(f"/proc/{pid}/stat")
    if not pathlib.Path("/proc/self/stat").exists():
        pytest.skip("no /proc to look the process up in")

    def ended():  # gone, or a zombie waiting to be reaped
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except FileNotFoundError:
            return True

    deadline = time.monotonic() + 10  # SIGKILL is delivered asynchronously
    while not ended() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ended(), f"the daemon {pid} outlived the check"


@pytest.fixture(scope="module")
def right(tmp_path_factory):
    path = tmp_path_factory.mktemp("right") / "right.py"
    path.write_text(BLOCKS + "\n\nclass Right(NoScale):\n    scaled = True\n")
    return path


def test_one_file_cannot_answer_for_the_next_and_the_right_block_still_passes(blocks, right):
    targets = [f"{blocks}:SpoilsTheNext", f"{right}:Right"]  # a child per file
    first, second = check_isolated(targets, kwargs={}, roles={})
    assert first.verdict == "FAIL" and second.verdict == "PASS", (str(first), str(second))
    assert second.compared and "result: PASS" in str(second)
