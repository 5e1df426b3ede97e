"""A sampler's batches across epochs, drawn ahead in a background thread: no drain at epoch ends.

lhotse's sampler fills its bucket buffer at the start of every epoch (seconds for a buffer of 20000 cuts)
and a DataLoader iterated once per epoch lets its workers run dry at every epoch end. :class:`EpochBatches`
is the sampler of one DataLoader iterator that serves the whole run: a thread draws up to ``depth``
batches ahead of the DataLoader, moving to the next epoch (``set_epoch``) as soon as one ends, so the next
epoch's bucket buffer is filled and its first batches are read while the current epoch's last ones are
trained. Each batch carries its epoch and its index in that epoch, so the loop knows where an epoch ends.

Only this thread touches the sampler while it runs; take ``lock`` to read or change the sampler
meanwhile (a checkpoint's ``sampler_state_dict``).
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any, Iterator, NamedTuple

from workbench.options import check_int

POLL_S = 0.1  # seconds between checks for a stop request while the queue is full


@dataclass(frozen=True)
class EpochBatch:
    """What the sampler thread hands the DataLoader: one batch of cuts, where it stands in its epoch."""

    epoch: int   # the sampler's epoch
    index: int   # 0-based position of this batch in its epoch
    cuts: Any    # the sampler's batch (a CutSet)


class LoadedBatch(NamedTuple):
    """What the DataLoader yields: the dataset's batch with its epoch and index (a NamedTuple, so pinned)."""

    epoch: int
    index: int
    batch: Any


@dataclass
class EpochBatchDataset:
    """``dataset[item.cuts]`` as a :class:`LoadedBatch` carrying ``item``'s epoch and index."""

    dataset: Any  # a map-style dataset: dataset[cuts] -> batch

    def __getitem__(self, item: EpochBatch) -> LoadedBatch:
        return LoadedBatch(item.epoch, item.index, self.dataset[item.cuts])


_END = object()


@dataclass
class _Failure:
    error: BaseException


class EpochBatches:
    """Iterable of :class:`EpochBatch` over epochs ``epoch``, ``epoch + 1``, ... of ``sampler``, drawn by a thread
    up to ``depth`` batches ahead of the reader. Iterating again stops the thread of the iteration before
    and starts over from :meth:`start_at`'s position (the sampler must be there: fresh, or restored from a
    state). An epoch that starts at index 0 and gives no batch ends the iteration (an empty corpus would
    loop forever); a resumed epoch may have nothing left."""

    def __init__(self, sampler, *, depth: int = 64):
        check_int(depth, "depth", 1)
        self.sampler, self.depth = sampler, depth
        self.lock = threading.Lock()  # held by the thread while it draws a batch
        self.epoch, self.index = 0, 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start_at(self, epoch: int, index: int) -> None:
        """The next iteration's first batch is batch ``index`` (0-based) of epoch ``epoch``."""
        check_int(epoch, "epoch", 0)
        check_int(index, "index", 0)
        self.epoch, self.index = epoch, index

    def __iter__(self) -> Iterator[EpochBatch]:
        self.stop()
        return self._read(self.epoch, self.index)

    def stop(self) -> None:
        """Stop the drawing thread (after the batch it is drawing, which may take an epoch start's seconds)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _read(self, epoch: int, index: int) -> Iterator[EpochBatch]:
        """The thread starts with the first batch asked for (a DataLoader calls iter() twice, and uses the last)."""
        self._stop = stop = threading.Event()
        items: queue.Queue = queue.Queue(maxsize=self.depth)
        self._thread = threading.Thread(target=self._draw, args=(epoch, index, items, stop), name="epoch-batches",
                                        daemon=True)
        self._thread.start()
        try:
            while (item := items.get()) is not _END:
                if isinstance(item, _Failure):
                    raise item.error
                yield item
        finally:  # the reader gone (an error, the iterator dropped): the thread stops after its batch
            stop.set()

    def _draw(self, epoch: int, index: int, items: queue.Queue, stop: threading.Event) -> None:
        def put(item) -> bool:
            while not stop.is_set():
                try:
                    items.put(item, timeout=POLL_S)
                    return True
                except queue.Full:
                    pass
            return False

        try:
            while not stop.is_set():
                first = index
                with self.lock:
                    self.sampler.set_epoch(epoch)  # the same epoch keeps a restored sampler's position
                    iter(self.sampler)
                while True:
                    with self.lock:
                        try:
                            cuts = next(self.sampler)
                        except StopIteration:
                            break
                    if not put(EpochBatch(epoch, index, cuts)):
                        return
                    index += 1
                if index == first == 0:
                    break
                epoch, index = epoch + 1, 0
        except BaseException as e:  # noqa: BLE001 - the reader raises it
            put(_Failure(e))
            return
        put(_END)
