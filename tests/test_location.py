"""Finding the version a path names: one `locate` for the reader and `kiln diff`."""

import pytest

import kiln.reader
from kiln.schemas import LATEST_FILENAME, METADATA_FILENAME, MetadataError, version_diff
from kiln.schemas.location import locate


def version_folder(root, name):
    folder = root / name
    folder.mkdir(parents=True)
    (folder / METADATA_FILENAME).write_text("{}")  # locate looks for it, reads nothing
    return folder


def outcome(find, path):
    try:
        return "found", find(str(path))
    except MetadataError as e:
        return "refused", str(e)


@pytest.mark.parametrize(
    "latest, found",
    [
        ("0a1b2c3d4e5f", "0a1b2c3d4e5f"),
        ("0a1b2c3d4e5f\n", "0a1b2c3d4e5f"),  # written with or without a newline
        ("", None),
        ("ffffffffffff\n", None),  # names a version that is not there
    ],
)
def test_latest_is_followed_alike_by_the_reader_and_diff(tmp_path, latest, found):
    version_folder(tmp_path, "0a1b2c3d4e5f")
    (tmp_path / LATEST_FILENAME).write_text(latest)
    finders = (locate, kiln.reader.locate, version_diff.locate)
    results = {outcome(find, tmp_path) for find in finders}
    assert len(results) == 1, results
    ((kind, value),) = results
    if found is None:
        assert kind == "refused" and str(tmp_path / LATEST_FILENAME) in value
    else:
        assert (kind, value) == ("found", str(tmp_path / found))


@pytest.mark.parametrize("latest", [b"\xff\n", b"0a1b2c3d4e5f\xfe\n"])
def test_a_latest_that_is_not_text_is_refused_alike(tmp_path, latest):
    # A damaged LATEST (or a bad rollback by hand) was a UnicodeDecodeError.
    version_folder(tmp_path, "0a1b2c3d4e5f")
    (tmp_path / LATEST_FILENAME).write_bytes(latest)
    results = {
        outcome(find, tmp_path) for find in (locate, kiln.reader.locate, version_diff.locate)
    }
    assert len(results) == 1, results
    ((kind, message),) = results
    assert kind == "refused"
    assert message.startswith(f"{tmp_path / LATEST_FILENAME} is not text"), message


def test_what_is_not_a_dataset_is_refused_alike(tmp_path):
    (tmp_path / "empty").mkdir()
    for path in (tmp_path / "empty", tmp_path / "missing"):
        results = {outcome(find, path) for find in (kiln.reader.locate, version_diff.locate)}
        assert len(results) == 1, results
        ((kind, message),) = results
        assert kind == "refused" and message.startswith(str(path))


def test_diff_also_finds_a_bare_version_id_beside_the_other_version(tmp_path):
    first = version_folder(tmp_path, "0a1b2c3d4e5f")
    second = version_folder(tmp_path, "5f4e3d2c1b0a")
    assert version_diff.locate("0a1b2c3d4e5f", relative_to=str(second)) == str(first)
    with pytest.raises(MetadataError, match="no version ffffffffffff beside"):
        version_diff.locate("ffffffffffff", relative_to=str(second))


def test_the_output_folder_names_the_datasets_it_holds(tmp_path):
    # `kiln inspect build/datasets`: the config's `output`, one level above a dataset.
    for name in ("shapes", "flowers"):
        version_folder(tmp_path / name, "0a1b2c3d4e5f")
        (tmp_path / name / LATEST_FILENAME).write_text("0a1b2c3d4e5f\n")
    (tmp_path / "notes").mkdir()  # not a dataset: not named
    for find in (locate, kiln.reader.locate, version_diff.locate):
        kind, message = outcome(find, tmp_path)
        assert kind == "refused"
        assert message.endswith(
            f"It is an output folder holding 2 dataset(s): pass one: "
            f"{tmp_path / 'flowers'}, {tmp_path / 'shapes'}."
        ), message


def test_an_empty_path_or_none_is_refused_as_such():
    # An unset variable (os.environ.get("DATA", "")) was looked for at "/":
    # "/ is not a kiln dataset".
    for find in (locate, kiln.reader.locate, kiln.reader.info, version_diff.locate):
        with pytest.raises(MetadataError, match=r"^the dataset path is empty \(an unset"):
            find("")
        with pytest.raises(
            TypeError, match=r"^a dataset path must be a str or os\.PathLike .*, got NoneType None$"
        ):
            find(None)


@pytest.mark.parametrize("find", [locate, kiln.reader.info, kiln.reader.locate])
def test_a_dataset_on_s3_is_refused_saying_to_copy_it(find):
    # TensorFlow has no s3:// filesystem: the reader says so in kiln's words,
    # with what to do, not as TensorFlow's "scheme 's3' not implemented".
    path = "s3://kiln-tests-no-such-bucket/datasets/shapes"
    found, message = outcome(find, path)
    assert found == "refused"
    assert message.startswith(f"{path}/{METADATA_FILENAME}: cannot read s3:// paths: "), message
    assert "copy the version folder to local disk or gs:// first" in message
