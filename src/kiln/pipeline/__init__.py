"""The build job: an Apache Beam pipeline that writes a kiln dataset.

Library entry point::

    from kiln.pipeline import build
    result = build("configs/demo.yaml", ["--direct_num_workers=2"])
    result.dataset_dir, result.version, result.info, result.up_to_date

Modules (each a noun for one job):

- `config`: the YAML config's schema, validation and resolution.
- `sources`: listing an image folder, a manifest or a COCO file (`coco`:
  its streaming reader). `listing`: the listed inputs, on disk (a
  temporary SQLite file), and the job's listing file.
- `images`: read, hash, decode, transform, encode (the heavy DoFn).
- `splits`: split assignment. `sharding`: deterministic shards and their
  writer. `tfrecord`: the record framing. `statistics`: pixel statistics.
- `error_report`: errors.jsonl. `versioning`: the version and up-to-date
  stamp. `publish`: staging, atomic publishing, LATEST.
- `job`: the job graph. `launcher`: `build`. `command`: `kiln build`.
- `demo_data`: `kiln demo-data`, the embedded demo input; `demo_targets`:
  its detection variant (`--targets`); `demo_drawing`: what both draw.
"""

from kiln.errors import ConfigError

__all__ = ["BuildError", "BuildResult", "ConfigError", "build"]


def __getattr__(name: str):
    # The launcher imports Beam: only when a build is asked for, so that
    # `kiln build --help` and a config error answer without it.
    if name in ("BuildError", "BuildResult", "build"):
        from kiln.pipeline import launcher

        return getattr(launcher, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
