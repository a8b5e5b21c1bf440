"""A Reader shared between threads: close() while other threads read."""

import threading
import time

import numpy as np
import pytest

import tensorwire as tw
from tensorwire import formats


def _wait_for(items, failure, timeout=5):
    """Waits until the list `items`, which another thread fills, is not empty."""
    deadline = time.monotonic() + timeout
    while not items and time.monotonic() < deadline:
        time.sleep(0.001)
    assert items, failure


@pytest.fixture
def big_file(tmp_path):
    """A file whose reads release the GIL (copies of 8 MiB)."""
    path = tmp_path / "big.safetensors"
    formats.save_file({"w": np.arange(2 << 20, dtype=np.float32),
                       "b": np.ones(4, np.float32)}, str(path))
    return path


def _reading_thread(reader, stop, results):
    """Reads in a loop until told to stop or the reader is closed."""
    def run():
        try:
            while not stop.is_set():
                results.append(reader.read_numpy("w", copy=True))
                reader["w"]
        except tw.InvalidArgumentError as e:
            results.append(e)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("how", ["close", "with"])
def test_close_succeeds_while_another_thread_reads(big_file, how):
    """close() (and a `with` exit) never fails with "Already borrowed" while reads
    release the GIL on another thread: reads in flight finish with the source they
    took, later ones raise the closed error."""
    stop, results = threading.Event(), []
    reader = tw.Reader(str(big_file))
    kept = reader["w"]
    thread = _reading_thread(reader, stop, results)
    _wait_for(results, "the reading thread read nothing")
    if how == "close":
        reader.close()
    else:
        reader.__exit__(None, None, None)
    assert reader.closed
    thread.join(10)
    stop.set()
    assert not thread.is_alive()
    # The thread stopped on the closed error, and every read before it was whole.
    assert isinstance(results[-1], tw.InvalidArgumentError)
    assert "closed" in str(results[-1])
    want = np.arange(2 << 20, dtype=np.float32)
    for got in results[:-1]:
        np.testing.assert_array_equal(got, want)
    # Arrays handed out before stay valid.
    np.testing.assert_array_equal(kept, want)
    with pytest.raises(tw.InvalidArgumentError, match="closed"):
        reader["b"]


def test_many_threads_read_and_one_closes(big_file):
    """Several readers and a close racing them: no error but the closed one."""
    reader = tw.Reader(str(big_file))
    stop, results = threading.Event(), []
    threads = [_reading_thread(reader, stop, results) for _ in range(3)]
    time.sleep(0.05)
    reader.close()
    for t in threads:
        t.join(10)
    stop.set()
    assert not any(t.is_alive() for t in threads)
    errors = [r for r in results if isinstance(r, Exception)]
    assert len(errors) == 3
    assert all("closed" in str(e) for e in errors)
    reader.close()  # closing twice is fine


@pytest.mark.parametrize("how", ["finish", "discard", "with"])
def test_writer_finish_waits_for_an_add_on_another_thread(tmp_path, how):
    """finish()/discard() (and a `with` exit) while another thread adds large tensors:
    it waits for the add in flight instead of failing with "Already borrowed"; later
    adds raise; the file holds whole tensors only."""
    path = str(tmp_path / "w.zt")
    x = np.arange(1 << 20, dtype=np.float32)
    writer = tw.Writer(path)
    added, errors = [], []

    def run():
        i = 0
        while i < 64:  # bounded, should finish() never stop it
            try:
                writer.write_numpy(f"t{i}", x, checksum="crc32c")
            except tw.InvalidArgumentError as e:
                errors.append(e)
                return
            added.append(f"t{i}")
            i += 1

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    _wait_for(added, "the writing thread wrote nothing")
    if how == "finish":
        writer.finish()
    elif how == "discard":
        writer.discard()
    else:
        writer.__exit__(None, None, None)
    assert writer.finished
    thread.join(10)
    assert not thread.is_alive()
    assert errors and "finished" in str(errors[0])
    if how == "discard":
        assert not (tmp_path / "w.zt").exists()
        return
    with tw.Reader(path) as r:
        assert r.verify() == len(r.keys()) >= len(added)
        for name in r.keys():
            np.testing.assert_array_equal(r[name], x)
