"""PixelBudget: the pixels reserved by threads never exceed the budget, except
for one image larger than the whole budget, which runs alone; first come,
first served."""

import random
import threading
import time

import pytest

from kiln.pipeline.pixel_budget import PixelBudget


class Tracker:
    """The pixels held inside reservations, and the most ever held at once."""

    def __init__(self):
        self.lock = threading.Lock()
        self.held = self.most = 0
        self.alone_violations = []

    def run(self, budget, pixels, hold_seconds):
        with budget.reservation() as reservation:
            reservation.acquire(pixels)
            with self.lock:
                if self.held and pixels > budget.total:
                    self.alone_violations.append(pixels)
                self.held += pixels
                self.most = max(self.most, self.held)
            time.sleep(hold_seconds)
            with self.lock:
                self.held -= pixels


def run_threads(targets):
    threads = [threading.Thread(target=target) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads), "a reservation never got in"


def test_threads_never_hold_more_than_the_budget():
    budget, tracker, rng = PixelBudget(100), Tracker(), random.Random(3)
    jobs = [(rng.randint(1, 60), rng.random() / 500) for _ in range(300)]
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                if not jobs:
                    return
                pixels, seconds = jobs.pop()
            tracker.run(budget, pixels, seconds)

    run_threads([worker] * 8)
    assert 60 < tracker.most <= 100  # several at once, never more than the budget
    assert budget.in_flight == 0


def test_an_image_larger_than_the_budget_runs_alone_and_is_not_starved():
    budget, tracker = PixelBudget(100), Tracker()
    stop = threading.Event()

    def small_images():
        while not stop.is_set():
            tracker.run(budget, 30, 0.001)

    def large_image():
        time.sleep(0.02)  # once the small ones keep the budget busy
        tracker.run(budget, 250, 0.01)
        stop.set()

    run_threads([small_images] * 6 + [large_image])
    assert tracker.most == 250 and not tracker.alone_violations
    assert budget.in_flight == 0


def test_reservations_are_admitted_in_arrival_order():
    budget, admitted = PixelBudget(10), []
    first = budget.reservation()
    first.__enter__().acquire(10)  # the budget is full

    def waiter(name, pixels):
        with budget.reservation() as reservation:
            reservation.acquire(pixels)
            admitted.append(name)

    threads = []
    for name, pixels in [("large", 8), ("small", 1)]:
        threads.append(threading.Thread(target=waiter, args=(name, pixels)))
        threads[-1].start()
        time.sleep(0.05)  # "large" waits first
    first.__exit__(None, None, None)
    for thread in threads:
        thread.join(timeout=5)
    assert admitted == ["large", "small"]


def test_pixels_are_released_when_the_work_fails():
    budget = PixelBudget(10)
    with pytest.raises(RuntimeError, match="decoding failed"):
        with budget.reservation() as reservation:
            reservation.acquire(7)
            assert budget.in_flight == 7
            raise RuntimeError("decoding failed")
    assert budget.in_flight == 0
    with budget.reservation():  # never acquired: nothing to release
        pass
    assert budget.in_flight == 0


def test_one_acquire_per_reservation_and_positive_sizes():
    budget = PixelBudget(10)
    with budget.reservation() as reservation:
        reservation.acquire(3)
        with pytest.raises(RuntimeError, match="already holds"):
            reservation.acquire(3)
        with pytest.raises(ValueError):
            budget.reservation().__enter__().acquire(0)
    with pytest.raises(ValueError):
        PixelBudget(0)
