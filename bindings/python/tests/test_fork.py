"""Parallel copies keep working in a process forked after they ran (multiprocessing
and DataLoader workers fork by default on Linux): threads do not survive fork, so
work handed to a thread pool there would never run and the copy would hang."""

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import tensorwire
    from tensorwire.shm import SharedTensor

    path, shm_name = sys.argv[1], sys.argv[2]
    big = np.arange(6 << 20, dtype=np.float32)  # 24 MiB: split across helpers
    with tensorwire.Writer(path) as w:
        w.add("big", big)

    def copies():
        r = tensorwire.Reader(path)
        assert np.array_equal(r.read_numpy("big", copy=True), big)
        st = SharedTensor.create_from(shm_name + str(os.getpid()), big)
        try:
            assert np.array_equal(st.get(), big)
        finally:
            st.close()
            st.unlink()

    copies()  # the parent starts the helper threads
    pid = os.fork()
    if pid == 0:
        import signal
        signal.alarm(60)  # a hung child ends itself rather than linger
        try:
            copies()
        except BaseException as e:
            print("child failed:", repr(e), flush=True)
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_copies_in_a_forked_child_do_not_hang(tmp_path):
    # A subprocess, so that a hang is a timeout here, not a stuck test run.
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "big.zt"), f"tw-fork-{os.getpid()}-"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
