"""`TrainingJobs`: jobs run in the order given, on one background thread or inline, and `run`
returns once the job given is in its training call."""

import threading
import time

import pytest

from replaygpu.agents.rollouts import TrainingJobs


def test_background_jobs_run_in_order_on_one_thread_and_run_returns_once_the_job_trains():
    jobs = TrainingJobs(background=True, name="test-train")
    log, threads = [], set()

    def job(i, seconds):
        def body(entering):
            threads.add(threading.current_thread().name)
            log.append(f"append {i}")
            entering()
            time.sleep(seconds)  # the training call
            log.append(f"trained {i}")
            return i * 10

        return body

    assert jobs.lag == 1
    jobs.run(job(0, 0.2), tag=256)
    assert log == ["append 0"]  # in its training call, not done
    jobs.run(job(1, 0.0), tag=512)  # starts once job 0 is done
    assert log[:3] == ["append 0", "trained 0", "append 1"]
    assert jobs.pending == 2
    assert jobs.finish_oldest() == (0, 256)
    assert jobs.finish_oldest() == (10, 512)
    assert jobs.pending == 0
    jobs.close()
    assert len(threads) == 1 and threads.pop().startswith("test-train")


def test_inline_jobs_run_when_given():
    jobs = TrainingJobs(background=False)
    assert jobs.lag == 0
    jobs.run(lambda entering: (entering(), "done")[1], tag=1)
    assert jobs.pending == 1
    assert jobs.finish_oldest() == ("done", 1)
    jobs.close()


def test_a_job_that_fails_before_training_neither_hangs_run_nor_loses_its_error():
    jobs = TrainingJobs(background=True)

    def failing(entering):
        raise ValueError("append refused")

    jobs.run(failing, tag=7)  # returns: the job ended without its training call
    with pytest.raises(ValueError, match="append refused"):
        jobs.finish_oldest()
    jobs.close()
