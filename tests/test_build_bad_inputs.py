"""Bad input never crashes a build: one corpus holding every kind of bad file and
bad manifest row builds, and each is an errors.jsonl row with its stage and
reason, counted per reason in kiln.json, the counters, the printed summary and
the --report JSON."""

import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import types
import zlib

import cv2
import numpy as np
import pytest
import yaml

import bombs
import kiln.reader
from conftest import make_config, run_kiln
from kiln import cli
from kiln.tools import verify
from kiln.transforms import encode_image
from test_build import corpus_files, read_all

CLASSES = ["circle", "square", "star", "triangle"]
FIELDS = {"key", "uri", "stage", "reason", "message"}


def png_declaring(width, height):
    """A PNG whose header declares width x height RGB pixels, with only a few
    rows of data: a decompression bomb's header, refused before decoding."""

    def chunk(kind, data):
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    rows = zlib.compress(b"\0" * (3 * width + 1) * 4)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")
    )


def qoi_image(width, height):
    """A valid QOI ("Quite OK Image") file, a real format OpenCV does not read."""
    pixels = b"".join(b"\xfe" + bytes([(17 * i) % 256, 90, 200]) for i in range(width * height))
    return b"qoif" + struct.pack(">IIBB", width, height, 3, 0) + pixels + b"\x00" * 7 + b"\x01"


def permission_denied_path(tmp_path):
    """A regular file that opening for reading really refuses (EACCES).

    For a normal user: a file with mode 000. Root reads any file whatever its
    mode bits, so as root: a write-only sysfs attribute such as
    /sys/bus/pci/uevent, which the kernel refuses to open for reading to
    every user.
    """
    if os.geteuid() != 0:
        path = tmp_path / "secret.png"
        path.write_bytes(b"\x89PNG\r\n\x1a\n")
        path.chmod(0)
        return str(path)
    candidates = sorted(glob.glob("/sys/bus/*/uevent")) + sorted(glob.glob("/sys/module/*/uevent"))
    for candidate in candidates:
        try:
            open(candidate, "rb").close()
        except PermissionError:
            return candidate
        except OSError:
            continue
    pytest.fail(
        "running as root and no write-only sysfs file found: nothing on this machine "
        "can stand for a file the build may not read"
    )


def write_bad_corpus(corpus, folder, tmp_path):
    """Good images plus one of every bad kind, under `folder`/images, and a
    manifest naming them. Returns (manifest path, good keys, expected drops:
    key -> (stage, reason, a piece of the message))."""
    images = folder / "images"
    good = [k for k in corpus_files(corpus) if k not in corpus.broken][::3]
    for key in good:
        (images / key).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(os.path.join(corpus.out_dir, key), images / key)
    with open(os.path.join(corpus.out_dir, good[0]), "rb") as f:
        whole = f.read()
    bad = images / "bad"
    bad.mkdir()
    files = {
        "empty.jpg": b"",
        "truncated.png": whole[: len(whole) // 2],
        "notes.png": b"these are my holiday notes, not a picture\n",
        "picture.qoi": qoi_image(4, 4),
        "bomb.png": png_declaring(50_000, 50_000),
        "tiny.png": encode_image(np.full((4, 6, 3), 128, np.uint8), format="png"),
        "hexagon.png": whole,  # a good image, with a label not in the class list
    }
    for name, data in files.items():
        (bad / name).write_bytes(data)
    os.mkfifo(bad / "pipe.png")
    (bad / "folder.png").mkdir()
    (bad / "link.png").symlink_to("/etc/hostname")  # a link out of the source
    denied = permission_denied_path(tmp_path)  # its folder is in source.allowed_roots

    rows = [f"images/{k},{k.split('/')[0]}" for k in good]
    rows += [f"images/bad/{name},circle" for name in files if name != "hexagon.png"]
    rows += [
        "images/bad/pipe.png,circle",
        "images/bad/folder.png,square",
        f"{denied},square",
        "images/bad/link.png,circle",
        "../../../../../../../../etc/passwd,circle",
        "images/bad/not_there.png,star",  # missing
        "images/bad/hexagon.png,hexagon",  # not in the class list
        f"images/{good[2]},circle,extra",  # does not parse: too many fields
        "images/bad/unlabelled.png,",  # does not parse: no label
        f"images/{good[3]},triangle",  # listed twice, labels disagree
    ]
    (folder / "manifest.csv").write_text("path,label\n" + "\n".join(rows) + "\n")

    def line(text):
        return f"manifest.csv:{rows.index(text) + 2}"

    expected = {
        "images/bad/empty.jpg": ("decode", "empty", "0 bytes"),
        "images/bad/truncated.png": ("decode", "corrupt", ""),
        "images/bad/notes.png": ("decode", "not_an_image", ""),
        "images/bad/picture.qoi": ("decode", "unsupported_format", "QOI"),
        # "declares": refused from the header, before OpenCV allocates anything
        "images/bad/bomb.png": ("decode", "too_many_pixels", "declares 50000x50000"),
        "images/bad/tiny.png": ("decode", "too_small", "6x4 (WxH), smaller than min_size 8"),
        "images/bad/pipe.png": ("list", "unreadable", "named pipe"),
        "images/bad/folder.png": ("list", "unreadable", "a folder"),
        denied: ("read", "unreadable", "Permission denied"),
        "images/bad/not_there.png": ("list", "missing", "not found"),
        "images/bad/link.png": ("list", "outside_source", "(it resolves to /etc/hostname)"),
        "../../../../../../../../etc/passwd": (
            "list",
            "outside_source",
            "outside the source folder",
        ),
        "images/bad/hexagon.png": ("list", "unknown_label", "'hexagon' is not in source.classes"),
        line(f"images/{good[2]},circle,extra"): ("list", "bad_row", "expected 2 fields, got 3"),
        line("images/bad/unlabelled.png,"): ("list", "bad_row", "empty path or label"),
        f"images/{good[3]}": ("list", "duplicate_key", "different label ("),
    }
    kept = sorted(f"images/{k}" for k in good if k != good[3])
    return str(folder / "manifest.csv"), kept, expected


@pytest.mark.timeout(300)  # a named pipe handed to the job would block forever
def test_every_kind_of_bad_input_is_dropped_with_a_reason(demo_corpus, tmp_path, capsys):
    manifest, kept, expected = write_bad_corpus(demo_corpus, tmp_path / "data", tmp_path)
    config = make_config(
        demo_corpus.out_dir,
        output=str(tmp_path / "out"),
        source={
            "type": "manifest",
            "path": manifest,
            "classes": CLASSES,
            "allowed_roots": [os.path.dirname(permission_denied_path(tmp_path))],
        },
        image={"channels": 3, "min_size": 8},
        errors={"max_fraction": 0.6},
        sharding={"num_shards": 1},
    )
    config_path = tmp_path / "bad-inputs.yaml"
    config_path.write_text(yaml.safe_dump(config))
    report_path = tmp_path / "report.json"

    code = cli.main(["build", "--config", str(config_path), "--report", str(report_path)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    report = json.loads(report_path.read_text())
    dataset_dir = report["dataset_dir"]

    with open(os.path.join(dataset_dir, "errors.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert all(set(row) == FIELDS for row in rows)
    found = {row["key"]: row for row in rows}
    assert sorted(found) == sorted(expected)
    for key, (stage, reason, fragment) in expected.items():
        row = found[key]
        assert (row["stage"], row["reason"]) == (stage, reason), row
        assert fragment in row["message"] and row["message"], row
        if reason != "bad_row":  # a row's uri is the manifest, checked below
            assert row["uri"].endswith(key.replace("images/", "", 1).lstrip("./")), row
    assert found[next(k for k in expected if k.startswith("manifest.csv:"))]["uri"] == manifest

    by_reason = {}
    for _, reason, _ in expected.values():
        by_reason[reason] = by_reason.get(reason, 0) + 1
    assert by_reason["unreadable"] == 3 and by_reason["outside_source"] == 2
    assert len(by_reason) == 12
    # Nothing of a file outside the source was read, so nothing of it is reported.
    with open("/etc/passwd") as f:
        first_line = f.readline().strip()
    assert first_line[:8] not in json.dumps(rows)
    with open(os.path.join(dataset_dir, "kiln.json")) as f:
        assert json.load(f)["dropped"] == by_reason
    assert report["dropped"] == by_reason and report["dropped_total"] == len(expected)
    assert report["objects_dropped"] is None is report["objects_dropped_file"]  # no boxes
    assert not os.path.exists(os.path.join(dataset_dir, "dropped_objects.jsonl"))
    assert {
        k[len("dropped_") :]: v for k, v in report["counters"].items() if k.startswith("dropped_")
    } == by_reason
    total = len(expected)
    listed = ", ".join(f"{reason}: {count}" for reason, count in sorted(by_reason.items()))
    assert f"  dropped: {total} ({listed}); see {dataset_dir}/errors.jsonl" in printed.out

    # Every good image is in the dataset, and the dataset checks out.
    records = read_all(
        types.SimpleNamespace(info=kiln.reader.info(dataset_dir), dataset_dir=dataset_dir)
    )
    assert sorted(r["key"] for split in records.values() for r in split) == kept
    assert verify.verify(dataset_dir).ok


def copy_good_images(corpus, root):
    """Every sixth good image of the demo corpus, copied to root/<class>/; their keys."""
    good = [k for k in corpus_files(corpus) if k not in corpus.broken][::6]
    for key in good:
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(os.path.join(corpus.out_dir, key), root / key)
    return good


@pytest.mark.timeout(300)
def test_image_folder_special_files_and_misplaced_files(demo_corpus, tmp_path):
    root = tmp_path / "images"
    good = copy_good_images(demo_corpus, root)
    os.mkfifo(root / "circle" / "pipe.jpg")
    os.symlink(root / "circle" / "deleted.png", root / "square" / "link.png")  # broken link
    # Broken, to a path outside the source: unreadable too (there is no folder to allow).
    os.symlink(tmp_path / "elsewhere" / "gone.png", root / "star" / "far_link.png")
    (root / "hexagon").mkdir()
    shutil.copyfile(os.path.join(demo_corpus.out_dir, good[0]), root / "hexagon" / "h.png")
    shutil.copyfile(os.path.join(demo_corpus.out_dir, good[0]), root / "loose.png")
    (root / ".cache").mkdir()
    (root / ".cache" / "thumbs.db").write_bytes(b"hidden files are not inputs")

    from kiln.pipeline import build

    result = build(
        make_config(
            str(root),
            output=str(tmp_path / "out"),
            source={"type": "image_folder", "root": str(root), "classes": CLASSES},
            errors={"max_fraction": 0.5},
            sharding={"num_shards": 1},
        )
    )
    with open(os.path.join(result.dataset_dir, "errors.jsonl")) as f:
        rows = {row["key"]: (row["stage"], row["reason"]) for row in map(json.loads, f)}
    assert rows == {
        "circle/pipe.jpg": ("list", "unreadable"),
        "square/link.png": ("list", "unreadable"),
        "star/far_link.png": ("list", "unreadable"),
        "hexagon/h.png": ("list", "unknown_label"),
        "loose.png": ("list", "unexpected_location"),
    }
    assert result.info.dropped == {"unreadable": 3, "unknown_label": 1, "unexpected_location": 1}
    assert sum(s.num_examples for s in result.info.splits.values()) == len(good)


def tiff_with_strip_past_the_end():
    """An uncompressed TIFF whose header reads fine but whose one strip of
    pixels is said to lie past the end of the file: OpenCV fails to decode
    it, and logs three lines about it (naming no file)."""
    image = np.full((30, 30, 3), 120, np.uint8)
    data = bytearray(cv2.imencode(".tif", image, [cv2.IMWRITE_TIFF_COMPRESSION, 1])[1])
    (directory,) = struct.unpack_from("<I", data, 4)
    (entries,) = struct.unpack_from("<H", data, directory)
    for entry in range(directory + 2, directory + 2 + 12 * entries, 12):
        tag, kind, count = struct.unpack_from("<HHI", data, entry)
        if tag == 273:  # StripOffsets, one LONG
            assert (kind, count) == (4, 1)
            struct.pack_into("<I", data, entry + 8, 10_000_000)
            return bytes(data)
    raise AssertionError("OpenCV wrote a TIFF without StripOffsets")


@pytest.mark.timeout(300)
def test_an_image_its_encoding_cannot_hold_is_dropped_and_opencv_prints_nothing(
    demo_corpus, tmp_path
):
    """A 70000x20 panorama (1.4 MP, under image.max_pixels) with the default
    jpeg encoding, whose limit is 65500 pixels per side: one encode_failed
    row, not a failed build. OpenCV's own lines about files it fails on
    (here a TIFF it cannot read) do not reach stderr: errors.jsonl names the file."""
    root = tmp_path / "images"
    good = copy_good_images(demo_corpus, root)
    (root / "circle" / "panorama.png").write_bytes(
        encode_image(np.full((20, 70_000, 3), 90, np.uint8), format="png")
    )
    (root / "square" / "damaged.tif").write_bytes(tiff_with_strip_past_the_end())
    config = make_config(
        str(root),
        output=str(tmp_path / "out"),
        source={"type": "image_folder", "root": str(root), "classes": CLASSES},
        transforms=[],  # stored as decoded
        encoding={"format": "jpeg"},
        errors={"max_fraction": 0.5},
        sharding={"num_shards": 1},
    )
    config_path = tmp_path / "wide.yaml"
    config_path.write_text(yaml.safe_dump(config))
    report_path = tmp_path / "report.json"

    built = run_kiln("build", "--config", str(config_path), "--report", str(report_path))
    assert built.returncode == 0, built.stderr
    for line in built.stderr.splitlines():  # no OpenCV line: "[ERROR:0@1.2] global ..."
        assert not line.startswith(("[ERROR", "[ WARN", "[ INFO")), built.stderr
    assert "imencode" not in built.stderr and "TIFF" not in built.stderr

    report = json.loads(report_path.read_text())
    with open(os.path.join(report["dataset_dir"], "errors.jsonl")) as f:
        rows = {row["key"]: row for row in map(json.loads, f)}
    assert sorted(rows) == ["circle/panorama.png", "square/damaged.tif"]
    panorama = rows["circle/panorama.png"]
    assert (panorama["stage"], panorama["reason"]) == ("encode", "encode_failed")
    assert "70000x20 (WxH), more than the 65500 pixels per side that jpeg" in panorama["message"]
    damaged = rows["square/damaged.tif"]
    assert (damaged["stage"], damaged["reason"]) == ("decode", "corrupt")
    assert report["dropped"] == {"corrupt": 1, "encode_failed": 1}
    assert sum(s["num_examples"] for s in report["splits"].values()) == len(good)


# A build in a fresh process, which reports its peak RSS and what OpenCV was
# asked to decode.
BUILD_AND_MEASURE = textwrap.dedent("""
    import json, resource, sys
    from kiln.transforms import decode
    decoded = []
    real_decode = decode.cv2.imdecodeWithMetadata
    def counted_decode(buffer, flags):
        decoded.append(len(buffer))
        return real_decode(buffer, flags)
    decode.cv2.imdecodeWithMetadata = counted_decode
    from kiln import cli
    code = cli.main(["build", "--config", sys.argv[1], "--report", sys.argv[2], "--quiet",
                     "--image-threads", "2"])
    # VmHWM: this process's own peak, not the size of the pytest process it
    # was forked from (which ru_maxrss would report). Its own helper
    # processes, if any, count with theirs.
    with open("/proc/self/status") as f:
        peak_kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    peak_kb = max(peak_kb, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    print(json.dumps({"code": code, "decoded": decoded, "peak_rss_bytes": peak_kb * 1024}))
""")
# Decoded, the bombs below would take 3.4 GB for the Radiance HDR alone, 4 GB
# for the PNG chunk; the build with its TensorFlow and Beam imports stays well
# below this.
PEAK_RSS_BOUND = 1_500_000_000


@pytest.mark.timeout(600)
def test_a_build_over_decompression_bombs_in_every_format_stays_small(demo_corpus, tmp_path):
    images = tmp_path / "images"
    good = copy_good_images(demo_corpus, images)
    corpus = dict(bombs.bombs(12000, 12000))  # 144 million pixels each
    corpus["bomb.hdr"] = bombs.radiance_hdr(12000, 12000)  # the reported 9 MB file, complete
    reasons = dict.fromkeys(corpus, "too_many_pixels")
    for name, (data, reason) in bombs.allocation_bombs().items():
        corpus[name], reasons[name] = data, reason
    for name, data in corpus.items():
        (images / "circle" / name).write_bytes(data)
    config = make_config(
        str(images),
        output=str(tmp_path / "out"),
        source={"type": "image_folder", "root": str(images), "classes": CLASSES},
        errors={"max_fraction": 0.9},
        sharding={"num_shards": 1},
    )
    assert "image" not in config  # image.max_pixels: the default, 89478485
    config_path = tmp_path / "bombs.yaml"
    config_path.write_text(yaml.safe_dump(config))
    report_path = tmp_path / "report.json"

    child = subprocess.run(
        [sys.executable, "-c", BUILD_AND_MEASURE, str(config_path), str(report_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    measured = json.loads(child.stdout.strip().splitlines()[-1])
    assert measured["code"] == 0, child.stderr[-3000:]
    # OpenCV saw the good images only, and the build stayed small.
    assert len(measured["decoded"]) == len(good)
    assert measured["peak_rss_bytes"] < PEAK_RSS_BOUND, measured["peak_rss_bytes"]

    dataset_dir = json.loads(report_path.read_text())["dataset_dir"]
    with open(os.path.join(dataset_dir, "errors.jsonl")) as f:
        rows = {row["key"]: row for row in map(json.loads, f)}
    assert sorted(rows) == sorted(f"circle/{name}" for name in corpus)
    for key, row in rows.items():
        name = key.split("/")[1]
        assert (row["stage"], row["reason"]) == ("decode", reasons[name]), row
        if reasons[name] == "too_many_pixels":
            assert "declares" in row["message"]
            assert "more than max_pixels 89478485" in row["message"]


def lzw_tiff(pixels: np.ndarray, damaged: bool) -> bytes:
    """An LZW TIFF OpenCV writes (one strip at this size), its strip's codes
    overwritten with 0xff when `damaged`: OpenCV still decodes it, logging a
    TIFF error, with garbage where the codes were."""
    ok, encoded = cv2.imencode(
        ".tif", pixels, [cv2.IMWRITE_TIFF_COMPRESSION, cv2.IMWRITE_TIFF_COMPRESSION_LZW]
    )
    assert ok
    data = bytearray(encoded.tobytes())
    (directory,) = struct.unpack_from("<I", data, 4)
    (entries,) = struct.unpack_from("<H", data, directory)
    for entry in range(directory + 2, directory + 2 + 12 * entries, 12):
        tag, kind, count, offset = struct.unpack_from("<HHII", data, entry)
        if tag == 273:  # StripOffsets, one LONG
            assert (kind, count) == (4, 1)
            if damaged:
                data[offset + 20 : offset + 120] = b"\xff" * 100
            return bytes(data)
    raise AssertionError("OpenCV wrote a TIFF without StripOffsets")


def test_a_tiff_with_damaged_strip_data_is_dropped_and_a_valid_one_stored_as_before(tmp_path):
    from kiln.pipeline import build

    rng = np.random.default_rng(5)
    root = tmp_path / "images"
    (root / "cat").mkdir(parents=True)
    for i in range(8):
        (root / "cat" / f"{i}.png").write_bytes(
            encode_image(np.full((16, 16, 3), 10 * i, np.uint8), format="png")
        )
    pixels = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)  # BGR, as OpenCV writes it
    (root / "cat" / "valid.tif").write_bytes(lzw_tiff(pixels, damaged=False))
    (root / "cat" / "damaged.tif").write_bytes(lzw_tiff(pixels, damaged=True))

    result = build(
        make_config(
            str(root),
            output=str(tmp_path / "out"),
            transforms=[],
            encoding={"format": "png"},
            splits={"fractions": {"train": 1.0}},
            sharding={"num_shards": 1},
            errors={"max_fraction": 0.2},
        )
    )

    with open(os.path.join(result.dataset_dir, "errors.jsonl")) as f:
        (row,) = map(json.loads, f)
    assert (row["key"], row["stage"], row["reason"]) == ("cat/damaged.tif", "decode", "corrupt")
    assert row["message"].startswith("TIFF image data is damaged: a strip or tile does not decode")
    (stored,) = [r for r in read_all(result)["train"] if r["key"] == "cat/valid.tif"]
    # The bytes a build stored before the check: OpenCV's pixels, as PNG.
    assert stored["encoded"] == encode_image(np.ascontiguousarray(pixels[:, :, ::-1]), format="png")


@pytest.mark.parametrize(("max_fraction", "published"), [(0.58, True), (0.57, False)])
def test_max_fraction_is_compared_exactly(demo_corpus, tmp_path, capsys, max_fraction, published):
    """29 of 50 files dropped is 0.58 of them, not more: in floats 0.58 * 50
    is 28.999999999999996, and the build failed with "dropped 29 of 50
    input files (58.0%), more than errors.max_fraction 58.0%"."""
    keys = sorted(
        f"{name}/{file}"
        for name in CLASSES
        for file in os.listdir(os.path.join(demo_corpus.out_dir, name))
        if f"{name}/{file}" not in demo_corpus.broken
    )[:21]
    data = tmp_path / "data"
    for key in keys:
        os.makedirs(data / os.path.dirname(key), exist_ok=True)
        shutil.copyfile(os.path.join(demo_corpus.out_dir, key), data / key)
    missing = [f"circle/missing_{index:02d}.png" for index in range(29)]
    rows = [f"{key},{key.split('/')[0]}" for key in keys + missing]
    (data / "manifest.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    config = make_config(
        demo_corpus.out_dir,
        output=str(tmp_path / "out"),
        source={"type": "manifest", "path": str(data / "manifest.csv"), "classes": CLASSES},
        errors={"max_fraction": max_fraction},
    )
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))

    code = cli.main(["build", "--config", str(config_path), "--quiet"])
    out, err = capsys.readouterr()

    if published:
        assert (code, out, err) == (0, "", "")
    else:
        assert code == 1 and err.startswith(
            "kiln build: failed: dropped 29 of 50 input files (58.0%), more than "
            "errors.max_fraction 57.0% (missing: 29)"
        ), err
