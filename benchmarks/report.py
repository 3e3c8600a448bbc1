"""The benchmark's results as targets met or not, a Markdown page and a console summary."""

from __future__ import annotations

import itertools
from typing import Any

from benchmarks import detection_bench, listing_bench, machine, startup_bench

# Why a target can be missed on this kind of machine; shown under the table
# only for targets a run did not meet. Each states the arithmetic, not hope.
WHY_NOT_MET = {
    "build_parallel": (
        "Two cores give at most 2.0x, and the build pays costs the loop does not. Fixed "
        "ones ({fixed:.1f} s by the scaling fit): listing, constructing and starting the "
        "Beam job, and after the last image the steps that count and write the shards, "
        "then `kiln.json`. At {images} images of {baseline_ms:.1f} ms (A's cost), 1.8x "
        "leaves {budget:.1f} s for them. A's own work on a bare thread pool, one thread per "
        "core, reached {pool:.2f}x in the same run ({pool_low:.2f}x to {pool_high:.2f}x "
        "between rounds): what these two cores gave this work at the time; the build ran "
        "at {of_pool:.0%} of that pool's rate. Per image, what the loop does not do runs on "
        "the same two cores: in the image threads the split, pixel statistics and version "
        "entry (~0.2 ms), and on the bundle thread, holding the GIL, adding them to the "
        "bundle's summary and the record to its sorted run. The marginal rate of the "
        "scaling fit is {marginal:.2f}x. Profiling found and fixed the larger losses: Beam's "
        "adaptive batching fed the thread pool 2-5 files at a time (now files stream "
        "through, 2 in flight per thread); the shard shuffle held every record in memory "
        "(now sorted runs on disk); every image went through ~15 Beam steps for "
        "statistics, splits, the version, the duplicate count and its way to a shard (now "
        "the image step sums the statistics per bundle and writes the sorted runs itself, "
        "and the listing holds 16 files per line, so no Beam step handles single images); "
        "the job graph had 48 steps, each costing time to build, translate and run (now "
        "29); OpenCV split single calls over both cores on top of the pool's threads (now "
        "one thread per call); pixel statistics merged Python Fractions per image (now "
        "integer sums); and full garbage collections walked TensorFlow's and Beam's "
        "objects (now frozen). When the host is busy, the two-thread build loses more than "
        "the one-thread loop (see how much A varied between rounds)."
    ),
    "build_one_thread": (
        "With one thread the build does A's work plus, on the same core, the split, pixel "
        "statistics and version entry of each image (~0.2 ms), Beam's work per group of "
        "16 files, and the fixed start and finish costs ({fixed:.1f} s). The ratio sits at "
        "the goal, within the spread of runs: the same build code measured 0.93x, 0.90x and "
        "0.88x in three make bench runs on 2026-12-07."
    ),
    "build_linear": "The cost per image grew with the dataset: see the scaling table.",
    "build_memory": (
        "The growth is the difference of two medians of the peaks of 5 builds, and "
        "identical builds of one size peak up to 10 MB apart (see the memory note under the "
        "scaling table): runs of the same build code measured +11 MB to +16 MB "
        "(2026-12-06 to 2026-12-07). What does grow is the shard writer's part (two shards "
        "written at once, "
        "each the split's bytes over the target rounded up to whole shards: ~13 MB at 4000 "
        "images, ~14.5 MB at 8000) and the holes the image threads leave in glibc's "
        "per-thread arenas, which grow with the image step's length; Python's heap itself "
        "grew ~270 bytes per image. MALLOC_ARENA_MAX=2 measured 4-6 MB less growth "
        "once, but on 2026-12-07 (5 alternating rounds of both sizes, each build in its "
        "own process, load 0.8-1.8) 10.9 MB against 12.1 MB, within the spread: it "
        "narrowed the spread of the peaks (742-744 and 753-755 MB against 742-748 and "
        "754-761 MB) and left the time as it was (7.0 and 13.3 s against 6.9 and 13.9 s), "
        "and on a host of many cores it would make the image threads share two arenas' "
        "locks: not taken. Next lever: the shard writer writing one shard at a time once "
        "the image step is done with the arenas."
    ),
    "build_incremental": (
        "An incremental build still lists the source, starts the Beam job, checks the "
        "base's files and joins the files with the base's record index (and with the "
        "listing the base was built from: a file whose size and modification time are "
        "unchanged is not read, its sha256 taken from the index), copies the reused "
        "records' frames from the base's shards into the new shards and writes every "
        "shard, the index and kiln.json again: fixed costs and per-record I/O a "
        "from-scratch build also pays, next to which only the decoding is saved. Measured "
        "per stage at 4000 images when every file was still read and hashed (2.4 s of "
        "CPU, all threads, with the frames copied straight from the base's shards): the "
        "image step was half of it (sha256 of all 320 MB of sources, ~50 us a file, now "
        "saved; decoding the 80 new and changed images, several ms each; ~30 us of Python "
        "per reused file), the launcher a fifth (listing the source, building the job, the "
        "comparison with the previous version, publishing), reading and joining the "
        "base's index 8%, writing the shards 8%, checking the base's files 3%, Beam's "
        "other stages the rest. Trusting the stamps, side by side against the code that "
        "read every file (4 alternating rounds, load average 0.9-1.7, medians): the "
        "incremental build 1.13 -> 0.95 s (1.41 -> 1.09 s of CPU), over the full build "
        "0.164 -> 0.140. See the notes under the incremental table for the levers "
        "measured and the next ones."
    ),
    "build_incremental_growth": (
        "Per record, an incremental build joins the file's stamp and index row and copies its "
        "record (a file whose stamp changed is also read and hashed); "
        "the ratio grows if those grow faster than decoding it: see the incremental table."
    ),
    "build_incremental_new_class": (
        "Each record whose class id moved is copied from the base's shard as a reused record "
        "is (no sorted run, no read of its own): the shard writer rewrites the id in the "
        "copied frame after checking it (`kiln.pipeline.relabel.FrameRelabel`: the record "
        "parsed and serialized by protobuf with its ids mapped, its CRC computed again). Over "
        "a plain night it still pays, per record, that parse and second CRC and an index "
        "entry serialized in the image step (a reused record passes the base's line on as it "
        "is): what the ratio can miss by. Where an id changes its varint width (127 -> 128 "
        "classes) records still take the old way: read, parsed and serialized again in the "
        "image step, through a run."
    ),
    "build_incremental_renamed_class": (
        "Each moved record is read from the base's shard on its own, parsed, its key and "
        "class id rewritten and serialized again (`kiln.pipeline.moves`), after a second "
        "pass of the image step (the files were read and hashed in the first, then joined "
        "with the base records of their bytes): a shuffle and a stage more than a plain night."
    ),
    "reader_b_over_a": (
        "(a) decodes and converts to float: one pass over the output. (b) decodes a crop "
        "window (libjpeg still entropy-decodes the rows above it, so a window costs ~80% of "
        "a full decode, not its area's share), then resizes it (a second full pass: the "
        "output is always 224x224) and applies the colour jitter (a 3x3 matrix, an offset, "
        "a clip and the contrast mean: passes over the window) and a flip. Each pass over a "
        "224x224x3 float image costs 30-60 us per element in tf.data, about a sixth of a "
        "JPEG decode, and stock TF ops do not fuse them (XLA, which would, loses more on "
        "its resize than it saves; see the peers' levers): measured per element, the "
        "resize and the colour jitter together cost more than half a decode. "
        "For raw pixels (a) is only a copy and a conversion, so the augmentation is most "
        "of (b)'s work and 0.85x is out of reach by construction. "
        "The levers that did pay are in place: the crop decoded from the JPEG, flips on the "
        "uint8 window, colour on the window before its resize (the window is smaller than "
        "the output), the resize in float, the stored size instead of reading each JPEG "
        "header, and the element map fused with its batch (each float element copied into "
        "the batch as soon as it is made); per-batch application of the colour ops was "
        "slower (a batch of "
        "128x224x224x3 floats does not fit in cache, so each pass is memory-bound). "
        "Measured on one core in tf.data for a 165x165 window (the average crop): the "
        "resize to 224x224 costs 130-190 us, the colour jitter ~140 us (~250 us before its "
        "channel means were taken row by row; its 3x3 matrix, a [pixels, 3] x [3, 3] "
        "matmul as slow as the resize, now runs as rows of 8 pixels against a block "
        "diagonal in half the time, 1.03x-1.05x end to end), the slice and flip 40 us. The "
        "one-op alternatives were slower still: `tf.image.crop_and_resize` (crop, flip and "
        "resize in one op) took the pipeline to 0.3x, `ScaleAndTranslate` is 5x slower "
        "than the resize, and a flip by negative-stride slicing halved the throughput."
    ),
    "reader_b_over_c": (
        "(c) is not a straw man: OpenCV's resize and colour conversion release the GIL "
        "and run on both cores, only the NumPy arithmetic holds it. It is slower than (b) "
        "for the GIL and the copies in and out of Python, not for worse kernels, so the "
        "gap is smallest where (b) itself is slowest (the same passes as above). The ratio "
        "also follows the host's CPU: OpenCV dispatches its kernels to the widest vector "
        "instructions the CPU has, TensorFlow's pip kernels use AVX at most (its start-up "
        "log lists AVX2, FMA and AVX-512 as unused). Every run before 2026-12-06 met the "
        "goal (5.3x to 5.9x within rounds on 2026-12-05); on 2026-12-06, on a host with "
        "AVX-512 where OpenCV ran its AVX-512 kernels, (c) ran 1.9x as fast as on "
        "2026-12-05's host (653 to 1221 images/s) and (b) 1.3x (3625 to 4635), and the ratio "
        "fell to 3.8x. Next lever: kernels compiled for the host, which stock TensorFlow "
        "has only through XLA (measured slower on the resize on an earlier host: see the "
        "peers' levers; to be measured again on AVX-512)."
    ),
    "reader_b_over_d": "The Keras layers run per batch; see the reader table.",
    "reader_b_targets_cost": (
        "Per element, the class mask is a PNG to decode in full (TensorFlow has no windowed "
        "PNG decode). Masks are stored without PNG row filters, which decode about 3x faster "
        "than OpenCV's default (~80 us instead of ~225 us for a 224x224 mask; side by side "
        "the cost went from 1.55x to 1.38x of (b)). Boxes and keypoints move once per batch, "
        "not per element (`move_batch_objects`, the same values; paired CPU per image 1.34x "
        "to 1.17x of (b)). The targets path's batch is now fused with its element map as "
        "(b)'s is: `ragged_batch` put a map of its own (the variant encoding of tensors of "
        "unknown size) between the two, so tf.data fused the batch with that small map and "
        "left the element map a stage apart; `kiln.reader.batching` encodes inside the "
        "element map and a plain batch follows (the same values and specs). Against the code "
        "before (`python -m benchmarks.reader_ab main`: make bench's pair of (b) and (b) with "
        "targets in fresh pipelines, alternating, the two codes' processes alternating) on "
        "this machine under load from other jobs (load average 4-14 on 2 cores), the CPU "
        "cost per image went from 1.28-1.32x to 1.20-1.26x of (b) (four runs, 42 pairs a "
        "side; the median of the runs' medians 1.31x to 1.22x); the wall ratio swung from "
        "0.5x to 3x within runs and cannot be read at that load, so the fusion's effect on "
        "make bench's own wall measure on a quiet machine is still to be taken. Not met: "
        "what is left is the class mask. On "
        "one tf.data thread over cached records (CPU per image, variants alternating, load "
        "4-6), boxes add 0.5% and the class mask 22-25% of (b)'s ~1,100 us: ~120 us its PNG "
        "decode and ~110 us its crop, flips and resize as one gather (each patched out in "
        "turn). The decode is zlib's inflate of run-like bytes (a bare zlib stream of the "
        "same mask takes as long, ~110 us; a 4-bit PNG is no faster and decodes scaled by 17, "
        "not as class ids); the same mask as a PNG without compression decodes in ~60 us, as "
        "raw bytes in ~9 us. Gathering the mask in one flat gather, or along its last axis, "
        "measured 2-2.5x slower than the row gathers and two transposes kept; computing the "
        "indices in closed form measured no faster; gathering a batch of masks at once "
        "(batch_dims) is slower than per element. The stored mask is now a choice per "
        "dataset: `targets.mask.encoding: raw` (the next row) trades the inflate for 49 KB "
        "more per record. Since, on a quiet machine (load 0-1.6): a `perf` profile of make "
        "bench's two pipelines in steady state (25 s each, symbols weighted by CPU per "
        "image) puts what boxes and the PNG mask add at ~190 us of (b)'s ~1,060 us: the "
        "PNG decode ~80 us (zlib's inflate 53 us, its adler32 check 20 us), the mask's two "
        "uint8 transposes 23 us, copies 20 us, ~20 us of page faults (nearly all in "
        "`CopyElementToSlice`: the batch copy writes into fresh pages), tf.data's per-op "
        "work ~15 us, boxes with their ragged encoding ~35 us (the mask patched out: "
        "1.033x). The deflate level changes the decode alone by up to 1.7x, by content: "
        "kiln's 224x224 box masks 87 us at level 6 and 54 us at level 3 (zlib's greedy "
        "matcher), but polygon masks 61 and 62 us and scene-like label maps 67 and 72 us; "
        "in make bench's pipelines (6 rounds, order rotating, CPU per image against (b)) "
        "level 6 gave 1.176x, level 3 1.174x, level 1 1.200x, raw 1.169x: not adopted. In "
        "a process that calls `kiln.reader.pool_host_memory()` the ratio is higher, 1.25x "
        "PNG and 1.23x raw (6 rounds), because pooling saves (b) more (161 us: its float "
        "batch's fresh pages) than the targets path (123 us). With tf.data's autotuning "
        "off (2026-12-07; see the peers' levers), which timed every op of every map call, "
        "the targets' element function, ~45 ops longer than (b)'s, gained more: `python -m "
        "benchmarks.reader_ab 0d4b4b9` (12 pairs a side, load 1.0-1.3) (b) 4894 to 5041 "
        "images/s, with targets 3527 to 3958, the cost 1.286x to 1.258x wall and 1.296x to "
        "1.272x CPU. On 2026-12-07, each part patched out in turn in make bench's "
        "pipelines (`kiln.reader.load`, batches of 128, 5 rounds, load ~1, CPU per image): "
        "(b) 360 us; with boxes and the PNG mask 468 us (1.30x), of which the mask's PNG "
        "decode 52 us, its crop, flip and resize ~20 us, and 36 us the rest (boxes and "
        "their ragged encoding, the mask's index vectors, the larger record, the mask's "
        "batch copy); with the raw mask 433 us (1.20x): its decode 11 us, sampling ~4 us, "
        "the rest 57 us (records 3.7x larger). The PNG decode is zlib's inflate on its "
        "slow path: libpng inflates one row at a time, and a 224-pixel row (225 bytes with "
        "its filter byte) is less than the 258 bytes of room zlib's fast path needs, so "
        "every byte takes the general one (perf of a loop of decodes: inflate 23% of the "
        "samples, adler32 8.5%). In a tf.data loop of the bench's masks: kiln's level 6 "
        "66 us, level 1 50 us, level 9 65 us, Z_RLE 188 us, a bare zlib stream through "
        "`decode_compressed` 73 us, raw 2.4 us. Sampling the masks once per batch, the "
        "gathers and transposes in one XLA-compiled function (the stored masks and their "
        "index vectors batched; equal outputs), took the sampling to ~6 us, but `python -m "
        "benchmarks.reader_ab` against the code before measured no change (1.289x to "
        "1.285x CPU, 12 pairs a side): not taken. So 1.15x needs the PNG decode gone; "
        "only raw storage does that, and its larger records cost most of what it saves. "
        "Two more levers measured on 2026-12-07, in a tf.data loop on one thread over "
        "200 of the bench's 224x224 masks (7 rounds, CPU per element, tf.data's own ~44 us "
        "included): the same bytes written as PNGs of wider rows (112x448 to 7x7168, "
        "reshaped after the decode), whose rows leave zlib's fast path room, decoded in "
        "135-142 us against 147 us, and in a second run 242-262 us against 256 us: the "
        "row-by-row inflate is not where the decode's time goes. A run-length encoding "
        "(the runs' starts and values as bytes) decoded with TensorFlow ops is slower "
        "than the PNG: `tf.repeat` 3,452 us, a bincount, cumsum and gather 763 us, the "
        "value steps scattered and summed 407 us, `searchsorted` and a gather 1,015 us, "
        "against the PNG's 166 us and raw bytes' 79 us: no stock op expands runs in one "
        "pass. Next levers: a smaller mask where the model predicts one (e.g. a stride-4 "
        "head), which `load` does not offer yet; a decode outside stock TensorFlow (a "
        "custom op) is ruled out by the reader's TensorFlow-and-NumPy-only install."
    ),
    "reader_b_targets_raw_cost": (
        "The class mask stored raw (`targets.mask.encoding: raw`, one byte per pixel) "
        "decodes in ~14 us instead of the PNG's ~118 us (CPU per element on one tf.data "
        "thread over cached records), but its records are ~67 KB instead of ~18 KB (the "
        "224x224 mask is 49 KB) and reading them (TFRecord read, CRC, copy) costs ~52 us "
        "instead of ~22 us per record: ~70 us to save of the ~270 us the targets add, about "
        "6 points of the ratio. Measured on this machine under load from other jobs (2 "
        "cores), CPU per image against (b), medians of 7 rounds with the three datasets in "
        "fresh pipelines and the order rotating: make bench's reading (`python -m "
        "benchmarks.mask_encoding_ab`) 1.256x with the PNG mask and 1.219x raw at load "
        "8.4-9.0, 1.260x and 1.254x at load 3.9-6.0; the same pipelines on one tf.data thread "
        "1.245x and 1.184x at load 5.9-6.4. The wall ratios (1.12x-1.45x PNG, 1.16x-1.20x "
        "raw) cannot be read at that load. Not met: what is left is the mask's crop, flips "
        "and resize (~70 us net per element, on one thread in a tf.function loop over a "
        "224x224 mask and a 165x160 window) and the larger records' read. Of the gather, "
        "the row gathers cost ~5 us; the two uint8 transposes that let the columns be "
        "gathered as rows ~35 us each. Measured against it (same loop, 3 rounds): slicing "
        "the window first so both transposes are smaller, 8 us less (not adopted, within "
        "what the pipeline resolves); `ResizeNearestNeighbor` on the sliced, flipped "
        "window 527 us; the column gather along axis 1 290 us; one flat gather 300 us; "
        "the transposes in int32 90 us against 80. Since: the leading crop is kept as a "
        "window (`MaskGrid`), and where the output is at least as tall as the stored mask "
        "(224 from 224 here) the window's columns are gathered first, so the transposes "
        "move the window's h x w bytes and then 224 x h, instead of 224 x 224 twice; the "
        "nearest indices of a crop, flip and square resize are computed in one set of ops, "
        "without the resize's gathers. In a tf.data loop over 224x224 masks (8 rounds, "
        "load ~1) the mask's moves went from 156 us to 123 us (window, columns first) and "
        "119 us (indices at once) net per element. In make bench's pipelines, old and new "
        "code in one process with (b), order rotating, CPU per image against (b): raw "
        "1.278x to 1.183x and PNG 1.272x to 1.149x (8 rounds, load 1.9-3.3), raw 1.199x "
        "to 1.164x and PNG 1.242x to 1.210x (10 rounds, load 2.3-3.4); `python -m "
        "benchmarks.reader_ab a31b978` (PNG, 12 pairs a side, load 2.1-3.8) 1.256x to "
        "1.192x; `python -m benchmarks.mask_encoding_ab` on the new code 1.141x PNG and "
        "1.146x raw (8 rounds, load 2.8-3.3), 1.211x and 1.177x in a later 6 rounds (load "
        "2.9-3.6). So 3-10 points less, and 1.15x not yet shown to be met: a quiet "
        "machine's make bench is to tell. tf.data's max_intra_op_parallelism=1 (each "
        "op, the transposes too, on one thread) changed neither ratio (6 rounds: raw "
        "1.177x against 1.164x, PNG 1.211x against 1.216x). "
        "Sampling the masks once per batch instead (the stored masks and their "
        "index vectors batched, then one `batch_dims` gather, transpose, gather, transpose "
        "for the batch) measured slower again: 154 us per element against 63 us in a "
        "tf.data loop of its own (the batch's 6.4 MB transposes leave the cache)."
        " On the faster host of 2026-12-05 (`python -m benchmarks.mask_encoding_ab`, 6 "
        "rounds, load ~1.3): (b) 419 us of CPU per image, the targets 1.285x (PNG) and "
        "1.238x (raw), +114 and +91 us: the PNG inflate is now ~23 us of it, and the "
        "rest is per-element work: the targets' element function runs 45 more ops than (b)'s "
        "(plus 42 constants: the record's extra features, the mask's window and its two "
        "gathers and transposes, two ragged encodings), each with tf.data's per-op "
        "cost. `ResizeNearestNeighbor` on the sliced, flipped window measured again "
        "there, in a tf.data loop on one thread (7 rounds): 306 us against the gathers' "
        "122 us per element (equal outputs on 300 windows). On 2026-12-07 the "
        "raw mask's sampling measured ~4 us and the larger records most of the 72 us the "
        "targets add (see the note above)."
    ),
    "reader_kiln_vs_best_peer": (
        "See the peers' table: each loader gets the same cores; which one is limited by "
        "what is in the notes under it."
    ),
    "reader_kiln_uint8_vs_best_peer": (
        "kiln computes the augmentation in float and casts to uint8 per element at the "
        "end; Grain's OpenCV chain stays in uint8 throughout. The colour op before the "
        "resize already gives levels (the 0..255 scale plus a half, so the resize needs no "
        "scaling pass before it and no rounding pass after it: 1.01x-1.04x); what is left is "
        "float pixels through the colour matrix and the resize; see the peers' levers."
    ),
    "reader_kiln_pooled_vs_best_peer": (
        "The trainer's process after `kiln.reader.pool_host_memory()` (TensorFlow's pooling "
        "host allocator, measured in a child process per round): kiln's float32 batches reuse "
        "their memory instead of faulting in 77 MB of fresh pages each. Grain and DALI do "
        "not allocate through TensorFlow, so the best peer is the same row as above. Without "
        "the call, the row above."
    ),
    "reader_kiln_pooled_vs_limit": (
        "With the batch memory reused by both, what is left is kiln's own pixel work over the "
        "limit's decode: the crop's bilinear resize and the colour jitter (see the peers' "
        "levers). The next levers: the colour ops on the accelerator (`load_for_model` "
        "moves every element op there), or a fused uint8 crop/flip/colour/resize kernel (a "
        "custom op, outside what `kiln.reader` may import today)."
    ),
    "reader_kiln_vs_limit": (
        "As for (b) against (a) above: the augmentation adds a resize and a colour pass "
        "over every image to the decode; on the larger stored images the window decode "
        "saves more of the decode, so the ratio is higher there. Both pay alike for "
        "float32 batches above glibc malloc's 32 MB mmap threshold (a page fault per 4 KB "
        "of every batch, ~300 us of system CPU per image here): without that cost "
        "(TensorFlow's pooling allocator) the ratio falls, as what is left is kiln's own "
        "pixel work; see the peers' levers."
    ),
}


# Under the incremental table: levers measured side by side (the table's own
# run cannot show them), and where the time goes.
INCREMENTAL_NOTES = """\
Levers measured (the incremental build alone against the revision before, each build in a
fresh process after a warm-up build, alternating rounds, medians; a busy shared machine, load
average 2-7, so CPU time is the steadier figure):

- The image step takes results as they complete, and hands an element's files with a base row
  to the thread pool as one task: CPU 3.02 -> 2.83 s. In input order a decoded image held back
  the reused files behind it (one core idle per decode), and every reused file paid its own
  hand-over to the pool, under the GIL.
- Beam's look-ups answered once per object while the job is built and run (a DoFn's state and
  timer specs, the options' views): building and translating the incremental job 315 -> 106 ms
  of CPU; the build 2.85 -> 2.70 s. Full builds save the same.
- Base index rows and reuse requests through Beam's shuffles as plain tuples (a NamedTuple is
  pickled), and a reused record's base line carried into the new index instead of
  re-serialized: 2.66 -> 2.50 s wall, 2.59 -> 2.44 s CPU.
- All three together against 4ca8346 (before them), twice 3 rounds with the full build in each:
  the incremental build 2.86 -> 2.41 s wall, 2.92-2.95 -> 2.35-2.45 s CPU; in the two quietest
  rounds (load average 2-2.5, full builds of 12-13 s against the table's 10.5) incremental /
  full 0.220 -> 0.176 and 0.229 -> 0.166 (under more load the full builds stretched most and
  both ratios fell to 0.10-0.15: only a quiet `make bench` gives the table's figure). At 8000
  images (2 rounds, load average 5.3) the incremental build's CPU went 5.94 -> 4.80 s, twice the
  saving at 4000: the part that shrank is per record, so the ratio does not grow.
- Not a lever: the launcher's comparison with the previous version (the summary's diff line)
  costs 60 ms of CPU at 4000 images.
- Reused records copied as byte ranges of the base's shards straight into the new shards
  (7917145 -> 6a73a7d): the base check, which hashes each base shard anyway, notes where each
  record's TFRecord frame starts (a side input, 8 bytes per base record); the image step hands
  a reused record on as (base shard, offset, length), and the shard writer copies the frames
  into the new shard, one read per range of neighbouring frames, checking each frame's length
  and CRCs. Gone: the copy step (a shuffle and a stage: the local runner runs 17 bundles, not
  18), reading and hashing every base shard a second time, writing the reused records to run
  files and reading them back, and framing them again. 4 rounds, load average 6-7: CPU
  2.49 -> 2.26 s.
- The shard writer writes up to `--image-threads` shards at once (reading, hashing and the CRC
  checks release the GIL, and at the end of the job the cores are otherwise idle), and a
  shard's index lines are spliced from the entries' canonical JSON instead of parsed and
  serialized again per record. Full builds write their shards the same way.
- All of it against 7917145, each side's incremental and full build in every round, 3 rounds
  at 4000 images (load average 4.4-7.6): the incremental build 4.66 -> 3.31 s wall, 2.47 ->
  2.22 s CPU; its CPU over the full build's 0.107 -> 0.095 (the full builds took 23.1-23.4 s
  of CPU). 6 more rounds of the incremental build alone (load average 6-7): 5.93 -> 5.13 s
  wall, 2.51 -> 2.44 s CPU. At 8000 images (2 rounds, load average 7.4-11): CPU 4.80 ->
  4.47 s, over the full build's 0.101 -> 0.093 (0.095 at 4000: it does not grow). Under
  this load the wall-time ratio (0.12 on both sides) says nothing: the full builds stretched to
  25-48 s against a quiet machine's 10.5, the incremental build far less. In the rounds above
  (load average 2-7) the incremental build's wall time tracked its CPU time (2.41 s wall at
  2.35-2.45 s of CPU), which puts this one near 2.2 s against a quiet full build's 10.5 s:
  about 0.2, not the goal's 0.15 (1.6 s). The bench's own incremental row (a fresh base
  build each round), 2 rounds alternating at load average 3.3-3.9: the incremental build
  2.45 and 3.83 s -> 2.13 and 3.65 s, next to full builds of 20-26 s, so its ratios (0.10-0.15
  on both sides) show the load, not the goal. Only a quiet `make bench` gives the table's
  figure.
- Where the image step's time goes, profiled (cProfile, the incremental build in one process
  with one image thread, 4000 images, 80 decoded): of its 1.34 s, reading the source files 0.60
  s and their sha256 0.23 s (the floor the reuse key sets, both outside the GIL), decoding the
  80 new images 0.18 s; the per-file Python is most of the rest, ~0.3 s under the profiler
  (which about doubles Python's cost), so the ~30 us per file estimated before is about right,
  and it is spread thin (three canonical-JSON hashes per file 0.12 s, the summary 0.07 s,
  handing results on 0.13 s, the rest the call itself). Half of each canonical-JSON call was
  `json.dumps` building a new encoder for its options: `canonical_json` now keeps one (the same
  text; every caller gains, full builds too). And a base of up to 16 files (a few shards and
  the index) is checked where it is listed, without the reshuffle of its own (a `Create`
  without reshuffle: the files are hashed in the stage that lists them, one shuffle and one
  stage fewer; more files are still spread over the workers). Both against 245f28f, the
  incremental build alone in a fresh process after a warm-up build of the same inputs, 12
  rounds alternating: at load average 2.7-3.2 (6 rounds) 2.21 -> 2.18 s wall, 2.11 -> 2.09 s
  CPU; at load average 4-10 (6 rounds) no direction (2.26 -> 2.36 s wall, 2.18 -> 2.22 s CPU;
  this side's two rounds at load 9-10.5 the slowest of all, 2.7 s CPU, the other rounds within
  0.1 s of each other). Within the noise: ~2 us of Python saved per hash is ~25 ms at 4000
  files, and the stage ~tens of ms; the build stays near 2.1-2.2 s (ratio ~0.2 against a quiet
  full build's 10.5 s), not the goal's 0.15 (1.6 s).
- Unchanged files not read: a file whose key, size and modification time (on `gs://`, the
  object's update time) are those the base listed takes its sha256 from the base's index row
  (the listing a version was built from is kept beside it, `.file-stamps/<version>/`, and joined
  by key with the files and index rows in the job), as the up-to-date check trusts the same
  stamps; `--rehash` reads every file. Against fffa325, the bench's own incremental row (a
  fresh base build each round, 4000 images), 4 rounds alternating, load average 0.9-1.7: the
  incremental build 1.13 -> 0.95 s wall, 1.41 -> 1.09 s CPU, over the full build (6.7-7.0 s)
  0.164 -> 0.140; every one of the 3920 reused files not read. On an object store the saving
  is the bucket's download.
- Where the incremental build's time goes now (`py-spy` over 16 builds of the bench's 4000-image
  scenario at load ~0.7, ~0.93 s each): the launcher's thread is busy ~0.86 s of it. The
  listing 105 ms (one `lstat` per row ~25 ms, its SQLite tables ~40 ms, the CSV ~15 ms), its
  hash and the job's listing file 33 ms, building the job 49 ms, the Beam job ~550 ms (its
  stages' bundle processors ~50 ms, hashing the base ~35 ms, the image step's Python per file,
  the shard writer), the comparison with the previous version 38 ms (both record indexes
  parsed, `json.loads` ~4 us a line), publishing's fsyncs ~10 ms. Three levers from it: Beam's
  `inspect.signature` answered once per function while a job is built and run (~3,200 calls
  of ~120 functions, ~25 ms; full builds save the same), a manifest row's image stat'ed once
  (confinement's `lstat` is its stat: 14 ms at 4000 rows), and the base's files hashed on the
  image threads at once. Against 48ce6dc, 5 alternating rounds of 5 builds each in a fresh
  process after a warm-up build, at load 1.2-2.5 (other jobs on the 2 cores): CPU 1.041 ->
  1.022 s, wall 1.212 -> 1.157 s (medians; the quickest builds 1.120 -> 0.956 s).
- The join's buckets by CRC-32 of the key instead of its sha256 (taken three times per file:
  the file, its base row, its stamp; 1.75 -> 0.2 us each), and the comparison with the
  previous version parsing each record index a block of lines per `json.loads` (28 -> 21 ms
  per 4000-line index, two indexes per build). Against 3ca1e2b, the bench's 4000-image
  scenario, 4 alternating rounds of 3 builds each in a fresh process after a warm-up build,
  at load 0.5-1.0: wall 1.365 -> 1.329 s, CPU 1.542 -> 1.519 s (medians; this driver restores
  the base's output folder before each build, so its builds take longer than the table's).
  About 2%: the ratio moves from ~0.152 to ~0.149 on the table's figures.

The next levers, by weight: the per-file Python under the GIL (~30 us per reused file) has no
single large part left (a `py-spy` profile of the bench's scenario on 2026-12-08, all threads:
decoding and transforming the 80 new and changed images ~25%, writing the shards with their
sha256 ~6%, listing the source ~5%, the comparison ~3%, hashing the base's shards ~3%, the
rest spread thin over Beam's stages and the per-file Python): computing
the listing inputs' fingerprint where the listing is written takes one hash of three off the
image threads (~10 ms at 4000); folding the version entry's hash, the split draw and the
summary into fewer calls would take a few more. The launcher's own work (listing, building
and translating the job, the comparison with the previous version, publishing) is a fifth,
the same in a full build. Then the base index, read and shuffled apart from the listing."""


# The targets rows' names, by reader targets variant (`reader_bench.TARGET_VARIANTS`).
TARGETS_COST_NAMES = {
    "b_targets": "reader: per-image cost with boxes + class mask vs (b)",
    "b_targets_raw": "reader: per-image cost with boxes + class mask stored raw vs (b)",
}


# A class added shifts every later class's id: those records are copied from
# the base's shards with their ids rewritten in the copied frame, not
# decoded, which costs a little more than copying a frame as it is; the
# night must still cost a fraction of a full build.
INCREMENTAL_NEW_CLASS_GOAL = 0.2

# A class folder of a tenth of the images renamed: those records are moved
# (read from the base's shard, key and class id rewritten, spilled to a run),
# not decoded; the night must cost a fraction of a full build.
INCREMENTAL_RENAMED_CLASS_GOAL = 0.2


def _target(key: str, name: str, value: float | None, goal: str, met: bool | None) -> dict:
    return {"key": key, "name": name, "value": value, "goal": goal, "met": met}


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of issue 5 with its measured value and whether it is met."""
    build = results["build"]
    rows = build["rows"]
    out = [
        _target(
            "build_parallel",
            "kiln build (local defaults) vs A",
            rows["kiln"]["ratio_vs_baseline"],
            ">= 1.8x",
            rows["kiln"]["ratio_vs_baseline"] >= 1.8,
        ),
        _target(
            "build_one_thread",
            "kiln build, one thread, vs A",
            rows["kiln_one_thread"]["ratio_vs_baseline"],
            ">= 0.9x",
            rows["kiln_one_thread"]["ratio_vs_baseline"] >= 0.9,
        ),
    ]
    scaling = build["scaling"]
    growth = max(
        later["ms_per_image"] / earlier["ms_per_image"]
        for earlier, later in itertools.pairwise(scaling)
    )
    out.append(
        _target(
            "build_linear",
            "build cost per image, largest growth between sizes",
            growth,
            "<= 1.10x (flat)",
            growth <= 1.10,
        )
    )
    # The two largest builds: both hold more than one shard's worth of
    # records, so the spill buffer (one shard) is full in both.
    memory = scaling[-1]["peak_rss_mb"] - scaling[-2]["peak_rss_mb"]
    out.append(
        _target(
            "build_memory",
            f"build peak memory growth, {scaling[-2]['images']} to {scaling[-1]['images']} images",
            memory,
            f"< one shard ({build['target_shard_mb']} MB)",
            memory < build["target_shard_mb"],
        )
    )
    rows_incremental = build.get("incremental", {}).get("rows", [])
    incremental = [
        row for row in rows_incremental if not row.get("new_class") and not row.get("renamed_class")
    ]
    new_class = [row for row in rows_incremental if row.get("new_class")]
    renamed_class = [row for row in rows_incremental if row.get("renamed_class")]
    if incremental:
        first, last = incremental[0], incremental[-1]
        out.append(
            _target(
                "build_incremental",
                f"incremental / full build time, {first['images']} images, "
                f"1% changed, added, deleted",
                first["ratio"],
                "<= 0.15",
                first["ratio"] <= 0.15,
            )
        )
        if len(incremental) > 1:
            out.append(
                _target(
                    "build_incremental_growth",
                    f"incremental / full ratio at {last['images']} over {first['images']} images",
                    last["ratio"] / first["ratio"],
                    "<= 1.10x (does not grow)",
                    last["ratio"] <= first["ratio"] * 1.10,
                )
            )
    for row in new_class:
        out.append(
            _target(
                "build_incremental_new_class",
                f"incremental / full build time, {row['images']} images, 1% changed and "
                f"deleted, 1% added of a new class (every class id shifts)",
                row["ratio"],
                f"<= {INCREMENTAL_NEW_CLASS_GOAL}",
                row["ratio"] <= INCREMENTAL_NEW_CLASS_GOAL,
            )
        )
    for row in renamed_class:
        out.append(
            _target(
                "build_incremental_renamed_class",
                f"incremental / full build time, {row['images']} images, a class folder of "
                f"{row['changes']} renamed (records moved)",
                row["ratio"],
                f"<= {INCREMENTAL_RENAMED_CLASS_GOAL}",
                row["ratio"] <= INCREMENTAL_RENAMED_CLASS_GOAL,
            )
        )
    for encoding, reader in results["reader"]["rows"].items():
        ratios = reader["ratios"]
        out += [
            _target(
                "reader_b_over_a",
                f"reader {encoding}: (b) kiln vs (a) limit",
                ratios["b_over_a"],
                ">= 0.85x",
                ratios["b_over_a"] >= 0.85,
            ),
            _target(
                "reader_b_over_c",
                f"reader {encoding}: (b) kiln vs (c) numpy_function",
                ratios["b_over_c"],
                ">= 4x",
                ratios["b_over_c"] >= 4.0,
            ),
            _target(
                "reader_b_over_d",
                f"reader {encoding}: (b) kiln vs (d) Keras layers",
                ratios["b_over_d"],
                ">= 2x",
                ratios["b_over_d"] >= 2.0,
            ),
        ]
    for key, row in (results["reader"].get("targets") or {}).items():
        out.append(
            _target(
                f"reader_{key}_cost",
                TARGETS_COST_NAMES.get(key, f"reader: per-image cost of {row['title']} vs (b)"),
                row["cost_vs_b"],
                "<= 1.15x",
                row["cost_vs_b"] <= 1.15,
            )
        )
    peers = results.get("peers")
    for label, loaders in (peers or {}).get("datasets", {}).items():
        from benchmarks import peers_bench

        found = peers_bench.ratios(loaders)
        for key, name, goal in (
            ("kiln_vs_best_peer", "kiln vs the best peer (Grain, DALI CPU), float32", 1.0),
            ("kiln_uint8_vs_best_peer", "kiln vs Grain, uint8 batches", 1.0),
            ("kiln_vs_limit", "kiln vs the decode-only limit (peers' table)", 0.85),
            (
                "kiln_pooled_vs_best_peer",
                "kiln with pool_host_memory() vs the best peer, float32",
                1.0,
            ),
            (
                "kiln_pooled_vs_limit",
                "kiln vs the decode-only limit, both with pool_host_memory()",
                0.85,
            ),
        ):
            if found[key] is not None:
                out.append(
                    _target(
                        f"reader_{key}",
                        f"reader {label}: {name}",
                        found[key],
                        f">= {goal:.2f}x",
                        found[key] >= goal,
                    )
                )
    return out


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _value(target: dict) -> str:
    if target["key"] == "build_memory":
        return f"{target['value']:+.0f} MB"
    text = f"{target['value']:.2f}x"
    if not target["met"] and target["goal"].startswith(
        ">= " + text.rstrip("x").rstrip("0").rstrip(".")
    ):
        text = f"{target['value']:.3f}x"  # 3.996x would print as the 4.00x it misses
    return text


def _round_range(rows: dict[str, Any], other: str) -> str:
    """``; 2.9x to 3.8x within single rounds``: (b) over `other` measured back to back."""
    ratios = [
        b / o
        for b, o in zip(rows["b"].get("runs", []), rows[other].get("runs", []), strict=False)
        if o
    ]
    if len(ratios) < 2:
        return ""
    return f"; {min(ratios):.1f}x to {max(ratios):.1f}x within single rounds"


def _rss_spread(scaling: list[dict[str, Any]]) -> str:
    """How far one size's peak memory moved between identical runs."""
    spreads = [
        row["peak_rss_range_mb"][1] - row["peak_rss_range_mb"][0]
        for row in scaling
        if "peak_rss_range_mb" in row
    ]
    if not spreads:
        return "one run per size"
    return f"identical runs of one size peaked up to {max(spreads):.0f} MB apart"


def _build_facts(build: dict[str, Any]) -> dict[str, float]:
    fit = build["scaling_fit"] or {}
    baseline = build["rows"]["baseline"]
    marginal = (fit.get("images_per_second") or 0.0) / baseline["images_per_second"]
    return {
        "fixed": fit.get("fixed_seconds") or 0.0,
        "images": build["images"],
        "baseline_ms": baseline["ms_per_image"],
        "budget": baseline["median_seconds"] / 1.8 - baseline["median_seconds"] / 2.0,
        "marginal": marginal,
        **_pool_facts(build["rows"]),
    }


def _pool_facts(rows: dict[str, Any]) -> dict[str, float]:
    """A on a bare thread pool: its ratio to A (median, and range over rounds),
    and the build's rate as a fraction of the pool's."""
    if "baseline_threads" not in rows:
        nan = float("nan")
        return {"pool": nan, "pool_low": nan, "pool_high": nan, "of_pool": nan}
    pool = rows["baseline_threads"]
    per_round = [
        a["seconds"] / p["seconds"]
        for a, p in zip(rows["baseline"]["runs"], pool["runs"], strict=False)
    ]
    return {
        "pool": pool["ratio_vs_baseline"],
        "pool_low": min(per_round),
        "pool_high": max(per_round),
        "of_pool": rows["kiln"]["images_per_second"] / pool["images_per_second"],
    }


def markdown(results: dict[str, Any]) -> str:
    """The page: how to reproduce, the machine, targets, then the build and reader tables."""
    m = results["machine"]
    v = m["versions"]
    build = results["build"]
    reader = results["reader"]
    corpus = results["corpus"]
    load = results["load_average"]
    lines = [
        "# kiln benchmarks",
        "",
        f"Reproduce with `make bench` (runs `{results['command']}`, about "
        f"{results['duration_seconds'] / 60:.0f} minutes here; the first run also generates "
        f"the corpus). The raw numbers are in `build/bench/results.json`. Nothing here is a "
        f"test: the test suite only checks that the harness runs (`tests/test_benchmarks.py`).",
        "",
        f"Measured {results['date']} on {machine.cpu_name(m)}, {m['cores']} cores, "
        f"{_fmt(m['memory_gb'], 1)} GB memory ({m['os']}); Python {v['python']}, "
        f"TensorFlow {v['tensorflow']}, Keras {v['keras']}, Apache Beam {v['apache-beam']}, "
        f"OpenCV {v['opencv']}, NumPy {v['numpy']}, kiln {v['kiln']}. The machine is a "
        f"shared virtual machine, so every number is the median of several runs with all "
        f"variants measured in turn. Other processes inside it kept "
        f"{_fmt(results['build']['background_cores'], 2)} cores busy during the build "
        f"measurements and {_fmt(results['reader']['background_cores'], 2)} during the reader "
        f"measurements (from `/proc/stat`, medians); the load average, {load['start']} at the "
        f"start and {load['end']} at the end, counts the benchmark's own threads.",
        "",
        "## Targets",
        "",
        "| Target | Measured | Goal | Met |",
        "|---|---:|---|:---:|",
    ]
    for target in results["targets"]:
        lines.append(
            f"| {target['name']} | {_value(target)} | {target['goal']} | "
            f"{'yes' if target['met'] else '**no**'} |"
        )
    missed = [t for t in results["targets"] if not t["met"]]
    if missed:
        lines += ["", "Targets not met, and why:", ""]
        seen = set()
        for target in missed:
            if target["key"] in seen:
                continue
            seen.add(target["key"])
            why = WHY_NOT_MET[target["key"]].format(**_build_facts(build))
            lines.append(f"- **{target['name']}**: {why}")

    lines += [
        "",
        f"## Build: {build['images']} photo-like {corpus['width']}x{corpus['height']} JPEGs",
        "",
        f"Config: resize the shorter side to 256, center crop 224, store as JPEG quality "
        f"{build['jpeg_quality']}, {build['target_shard_mb']} MB shards. The corpus is "
        f"{corpus['images']} generated JPEGs (smooth colour fields, textures, shaded shapes, "
        f"sensor noise; {corpus['mean_file_kb']:.0f} KB on average). Every build runs in its "
        f"own process; the time is the work only (the loop, or `kiln build` from listing to "
        f"publishing), not starting Python and importing TensorFlow and Beam. Peak memory is "
        f"the process's peak resident set (imports included). Medians of "
        f"{build['repeats']} runs, memory too.",
        "",
        "| Variant | Seconds | Images/s | vs A | Best run, images/s | Peak RSS (MB) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for key in (
        "baseline",
        "kiln",
        "kiln_scaled_decode",
        "kiln_one_thread",
        "baseline_opencv_threads",
        "baseline_threads",
    ):
        if key not in build["rows"]:
            continue
        row = build["rows"][key]
        best = row["images"] / min(run["seconds"] for run in row["runs"])
        lines.append(
            f"| {row['title']} | {row['median_seconds']:.2f} | "
            f"{row['images_per_second']:.0f} | {row['ratio_vs_baseline']:.2f}x | "
            f"{best:.0f} | {row['peak_rss_mb']:.0f} |"
        )
    baseline_seconds = [run["seconds"] for run in build["rows"]["baseline"]["runs"]]
    lines += [
        "",
        "A does exactly the same work per image as the build (read, sha256, OpenCV decode, "
        "the same transforms chain, `encode_image`, `RECORD.encode`) and writes one file with "
        "`tf.io.TFRecordWriter`; it does not shard, sort, compute statistics or write "
        "metadata. Its OpenCV is held to one thread, so it is the single-core limit. "
        "The image.jpeg_scaled_decode row is the local defaults with that opt-in option: "
        "libjpeg decodes each JPEG at 1/2 (its DCT scaling), and the resize to 256 starts "
        "from a quarter of the pixels; the records keep their sizes, their pixels differ "
        "slightly from a full decode's. "
        "The last row runs A's per-image work on a plain thread pool, one thread per core, "
        "writing in order: what these cores give this work with no pipeline at all, the "
        "ceiling for the build's ratio on this machine. "
        f"Between rounds, A itself took {min(baseline_seconds):.1f} to "
        f"{max(baseline_seconds):.1f} s: the virtual machine's speed varies with its "
        f"neighbours on the host, which `ps` and `/proc/stat` inside it do not show, and the "
        f"two-thread build suffers most when it does.",
        "",
        "### Scaling: kiln build, local defaults",
        "",
        *(
            [
                "Builds larger than the corpus read it more than once (hard-linked copies under "
                "new keys: the same bytes, every image a duplicate of one already built).",
                "",
            ]
            if build["scaling"][-1]["images"] > corpus["images"]
            else []
        ),
        "| Images | Seconds | Images/s | ms per image | Peak RSS (MB) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in build["scaling"]:
        lines.append(
            f"| {row['images']} | {row['median_seconds']:.2f} | "
            f"{row['images_per_second']:.0f} | {row['ms_per_image']:.2f} | "
            f"{row['peak_rss_mb']:.0f} |"
        )
    fit = build["scaling_fit"]
    if fit and fit["images_per_second"]:
        marginal = fit["images_per_second"] / build["rows"]["baseline"]["images_per_second"]
        lines += [
            "",
            f"Least-squares fit: {fit['fixed_seconds']:.2f} s fixed (start-up, shuffles, "
            f"metadata) + {fit['ms_per_image']:.2f} ms per image, i.e. "
            f"{fit['images_per_second']:.0f} images/s once the job runs ({marginal:.2f}x A). ",
        ]
    previous, last = build["scaling"][-2], build["scaling"][-1]
    growth = last["peak_rss_mb"] - previous["peak_rss_mb"]
    per_image_kb = growth * 1024 / max(1, last["images"] - previous["images"])
    lines += [
        "",
        f"Memory: the records never pass through Beam's shuffle. The image step writes "
        f"them, framed as in a shard, to sorted run files of at most one shard, and shards "
        f"are grouped from one slice (an index of ~30 bytes per record) per run and shard "
        f"(before this, the local runner held every record in memory, and the peak grew by "
        f"about 100 KB per image). From {previous['images']} to {last['images']} images the "
        f"peak grew by {growth:.0f} MB ({per_image_kb:.1f} KB per image; "
        f"{_rss_spread(build['scaling'])}). Little of that is per image: at the first shard "
        f"write Python's heap (tracemalloc) held 2.1 MB more at 8000 images than at 4000 "
        f"(~270 bytes per image: the listing's lines, the runs' indexes and content hashes "
        f"in the collections the local runner keeps between stages). The peak is the shard "
        f"writer's, two shards at once with the local default of two threads, on top of what "
        f"the image step left: so it follows the shard size, the split's bytes over the "
        f"target rounded up to whole shards (5 shards of ~13 MB at 4000 images, 9 of ~14.5 "
        f"MB at 8000), and the holes the image threads leave in glibc's per-thread arenas, "
        f"which grow with the step's length (with MALLOC_ARENA_MAX=2, on the views alone, "
        f"the growth was 9 MB instead of 13-15). "
        f"Against d1002b7 the shard writer holds a shard's records once (the run files hold "
        f"them framed and it writes views into its reads; it used to copy each record out of "
        f"the read, then again into a frame) and hands the allocator's free pages back "
        f"(malloc_trim) before each shard. Paired runs of both, alternating, each build in "
        f"its own process, medians of 3 rounds (2026-12-03, load average 4-8 from other "
        f"jobs on the 2 cores): 4000 images 772 -> 745 MB, 8000 images 789 -> 757 MB, growth "
        f"17 -> 11 MB (over 9 rounds in three sessions the old revision grew by 22 MB, 772 -> "
        f"795; 6 rounds of the new one, 743 -> 754). The views alone took 19-26 MB off, the "
        f"trim a further 16 MB at both sizes (so not the growth). Below one shard's worth of "
        f"records the spill buffer is not full yet, so smaller builds peak lower.",
    ]

    incremental = build.get("incremental")
    if incremental:
        lines += [
            "",
            "## Incremental builds",
            "",
            f"A base build, then {incremental['fraction']:.0%} of the images get new content, "
            f"{incremental['fraction']:.0%} are added and {incremental['fraction']:.0%} deleted; "
            f"the rebuild reuses the base's unchanged records (`kiln build`, LATEST as base) "
            f"next to a from-scratch build of the same inputs, whose dataset is checked to be "
            f"byte-identical (kiln.json). Median of {incremental['repeats']} runs.",
            "",
            "| Images | Changed / added / deleted | Incremental s | Full s | Ratio |",
            "|---:|---:|---:|---:|---:|",
        ]
        for row in incremental["rows"]:
            each = f"{row['changes']} each"
            if row.get("new_class"):
                each += ", the added of a new class"
            if row.get("renamed_class"):
                each = f"none; a class folder of {row['changes']} renamed"
            lines.append(
                f"| {row['images']} | {each} | "
                f"{row['incremental_seconds']:.2f} | {row['full_seconds']:.2f} | "
                f"{row['ratio']:.3f} |"
            )
        lines += ["", INCREMENTAL_NOTES.rstrip("\n")]

    rows = reader["rows"]
    lines += [
        "",
        f"## Reader: batches of {reader['batch_size']} images of "
        f"{reader['image_size']}x{reader['image_size']}, CPU",
        "",
        f"The build's {build['images']} images as two datasets written by `kiln build`: JPEG "
        f"quality {build['jpeg_quality']} ({reader['dataset_mb']['jpeg']:.0f} MB) and raw "
        f"pixels ({reader['dataset_mb']['raw']:.0f} MB). Augmentation: "
        f"`{reader['augment']}` (color_jitter's defaults: brightness, contrast, saturation "
        f"0.4, hue 0.1). All variants read the same way (interleaved files, the same shuffle "
        f"buffer, prefetch) and yield float32 batches in [0, 1]. Median of "
        f"{reader['repeats']} runs.",
        "",
        "| Variant | JPEG images/s | vs (a) | raw images/s | vs (a) |",
        "|---|---:|---:|---:|---:|",
    ]
    for key in rows["jpeg"]:
        if key == "ratios":
            continue
        jpeg, raw = rows["jpeg"][key], rows["raw"][key]
        lines.append(
            f"| {jpeg['title']} | {jpeg['images_per_second']:.0f} | "
            f"{jpeg['ratio_vs_a']:.2f}x | {raw['images_per_second']:.0f} | "
            f"{raw['ratio_vs_a']:.2f}x |"
        )
    for row in (reader.get("targets") or {}).values():
        lines.append(
            f"| {row['title']} | {row['images_per_second']:.0f} | "
            f"{row['cost_vs_b']:.2f}x cost of (b) | - | - |"
        )
    lines += [
        "",
        f"(b) vs (c): {rows['jpeg']['ratios']['b_over_c']:.1f}x (JPEG"
        f"{_round_range(rows['jpeg'], 'c')}), {rows['raw']['ratios']['b_over_c']:.1f}x (raw"
        f"{_round_range(rows['raw'], 'c')}); (b) vs (d): "
        f"{rows['jpeg']['ratios']['b_over_d']:.1f}x (JPEG), "
        f"{rows['raw']['ratios']['b_over_d']:.1f}x (raw). (b) spreads its work over both "
        f"cores through tf.data's threads, while the GIL holds part of (c) to one, so the "
        f"ratio can move with how much of the second core the virtual machine gets.",
        "",
        "- (a) parses and decodes only (per element for JPEG, one `decode_raw` per batch for "
        "raw), then converts to float.",
        "- (c) does the same augmentations in NumPy/OpenCV in `tf.numpy_function`, the "
        "pattern kiln exists to replace; (d) uses Keras 3 preprocessing layers on each "
        "batch in `Dataset.map` (RandomZoom stands in for random_resized_crop, which Keras 3 "
        "does not have).",
        "- The targets rows: each round measures the targets variant and (b) on the same "
        "images without targets one right after the other, "
        + ("once" if reader.get("target_pairs", 1) == 1 else f"{reader['target_pairs']} times")
        + " (which first alternates); the cost is the median of the pairs' ratios, (b)'s "
        "images/s over the variant's.",
        "",
        "### Augmentation on the accelerator",
        "",
        f"`load_for_model(...)` returns unaugmented uint8 batches and an "
        f"`AugmentationLayer` with the same augmentation (same seeds, same results). On this "
        f"CPU, inside a `tf.function`, the layer augments "
        f"{reader['layer']['images_per_second']:.0f} images/s (batches of "
        f"{reader['layer']['batch_size']}); on a GPU it moves that work off the host.",
        "",
    ]
    if "detection" in results:
        lines.append(detection_bench.markdown(results["detection"]))
    if "listing" in results:
        lines.append(listing_bench.markdown(results["listing"]))
    if "startup" in results:
        lines.append(startup_bench.markdown(results["startup"]))
    return "\n".join(lines)


def summary(results: dict[str, Any]) -> str:
    """A few lines for the console."""
    lines = []
    for target in results["targets"]:
        lines.append(
            f"{'met    ' if target['met'] else 'NOT MET'}  {target['name']}: "
            f"{_value(target)} (goal {target['goal']})"
        )
    return "\n".join(lines)
