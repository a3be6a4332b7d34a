"""Fill a model folder once: download every file of a source, check it, then write the completion marker.

Run by the cache's download Job (``llm-autopilot fetch``). A restart resumes: finished files are kept, a
``.partial`` file continues from its size (an HTTP Range request). Each file's size is checked, and its content
against the MD5 an S3 ETag carries (single-part uploads) or the SHA-256 the Hub lists for an LFS file. The marker
(:data:`MARKER`) is written last, only when every check passed: pods start only on a folder that has it.

Progress goes to stdout, one JSON line at a time (``{"fetch": "progress", "bytes": ..., "total": ...}``), and
the summary to the termination message: the operator reads both through the pod (logs and status) it may read
already, so the Job's pod needs no Kubernetes credentials at all.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from llm_autopilot.api.sources import S3Source
from llm_autopilot.hub.client import ModelFetchError
from llm_autopilot.storage.s3 import S3Client, md5_of

MARKER = ".llm-autopilot-complete"
PARTIAL = ".partial"
_CHUNK = 2**20


class FetchError(ModelFetchError):
    """The folder could not be filled; nothing is marked complete. The message says why."""


@dataclass(frozen=True)
class Wanted:
    """One file to have: its path in the folder, its size, and the digest to check when the source gives one."""

    path: str
    size: int
    md5: str | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class Summary:
    files: int
    total_bytes: int
    downloaded_bytes: int
    already_complete: bool = False

    def as_json(self) -> str:
        return json.dumps({"fetch": "complete", "files": self.files, "bytes": self.total_bytes,
                           "downloaded": self.downloaded_bytes, "alreadyComplete": self.already_complete})


Progress = Callable[[int, int], None]


def _inside(dest: Path, relative: str) -> Path:
    target = (dest / relative).resolve()
    if not target.is_relative_to(dest.resolve()) or relative.startswith("/"):
        raise FetchError(f"refusing {relative!r}: it would be written outside {dest}")
    return target


def _digest(path: Path, algorithm: str) -> str:
    if algorithm == "md5":
        return md5_of(path)
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check(path: Path, want: Wanted, where: str) -> None:
    """Raise FetchError when the file's size or digest is not the source's."""
    size = path.stat().st_size
    if size != want.size:
        raise FetchError(f"size mismatch for {where}: got {size} bytes, the source lists {want.size}")
    for algorithm, expected in (("md5", want.md5), ("sha256", want.sha256)):
        if expected and _digest(path, algorithm) != expected:
            raise FetchError(f"{algorithm} mismatch for {where}: the download is not the file the source lists "
                             f"({expected}); it was removed and is fetched again on the next try")


def fill(dest: Path, wanted: Iterable[Wanted], stream: Callable[[Wanted, int], Iterable[bytes]], *,
         describe: Callable[[Wanted], str], progress: Progress | None = None) -> Summary:
    """Download every wanted file into ``dest`` (resuming), check each, then write the marker."""
    files = list(wanted)
    total = sum(w.size for w in files)
    if (dest / MARKER).is_file():
        return Summary(len(files), total, 0, already_complete=True)
    dest.mkdir(parents=True, exist_ok=True)
    done = downloaded = 0
    for want in files:
        target = _inside(dest, want.path)
        where = describe(want)
        if target.is_file() and target.stat().st_size == want.size:
            done += want.size  # finished (and checked) before a restart
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + PARTIAL)
        offset = partial.stat().st_size if partial.is_file() else 0
        if offset > want.size:
            partial.unlink()
            offset = 0
        done += offset
        try:
            with partial.open("ab") as out:
                for chunk in stream(want, offset) if offset < want.size else ():
                    out.write(chunk)
                    done += len(chunk)
                    downloaded += len(chunk)
                    if progress is not None:
                        progress(done, total)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise FetchError(f"the cache volume is full: {where} ({want.size} bytes) does not fit after "
                             f"{done} of the model's {total} bytes; raise spec.model.cache.size (or leave it unset "
                             "to size it from the checkpoint)") from exc
        try:
            check(partial, want, where)
        except FetchError:
            partial.unlink()
            raise
        os.replace(partial, target)
    (dest / MARKER).write_text(json.dumps({"files": len(files), "bytes": total}) + "\n")
    if progress is not None:
        progress(total, total)
    return Summary(len(files), total, downloaded)


def s3_wanted(client: S3Client, source: S3Source) -> list[Wanted]:
    objects = [o for o in client.list(source.bucket, source.prefix) if not o.key.endswith("/")]
    if not objects:
        raise FetchError(f"{source.uri} holds no objects: check the bucket and prefix of spec.model.source")
    cut = len(source.prefix) + 1 if source.prefix else 0
    return [Wanted(o.key[cut:], o.size, md5=o.md5) for o in objects]


def fetch_s3(client: S3Client, source: S3Source, dest: Path, *, progress: Progress | None = None) -> Summary:
    """Every object under the prefix into ``dest``, keyed by its path below the prefix."""
    wanted = s3_wanted(client, source)
    return fill(dest, wanted, lambda w, offset: client.stream(source.bucket, source.key(w.path), offset),
                describe=lambda w: f"s3://{source.bucket}/{source.key(w.path)}", progress=progress)


class ProgressPrinter:
    """A JSON progress line on stdout at most every ``interval`` seconds."""

    def __init__(self, write: Callable[[str], None], interval: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._write = write
        self._interval = interval
        self._clock = clock
        self._last = -interval

    def __call__(self, done: int, total: int) -> None:
        now = self._clock()
        if done < total and now - self._last < self._interval:
            return
        self._last = now
        percent = round(100 * done / total, 1) if total else 100.0
        self._write(json.dumps({"fetch": "progress", "bytes": done, "total": total, "percent": percent}))


def hub_wanted(repo: str, revision: str | None, *, token: str | None, endpoint: str | None) -> list[Wanted]:
    """The files of a Hub repository at a revision, with the size and (LFS files) SHA-256 the Hub lists."""
    from huggingface_hub import HfApi  # noqa: PLC0415 - only the fetch command needs it

    info = HfApi(endpoint=endpoint, token=token or False).model_info(repo, revision=revision,
                                                                     files_metadata=True)
    wanted = []
    for sibling in info.siblings or []:
        lfs = sibling.lfs
        size = lfs.size if lfs is not None else sibling.size
        if size is None:
            raise FetchError(f"the Hub lists no size for {repo}/{sibling.rfilename}")
        wanted.append(Wanted(sibling.rfilename, int(size), sha256=lfs.sha256 if lfs is not None else None))
    if not wanted:
        raise FetchError(f"{repo} lists no files on the Hub")
    return wanted


def hub_stream(repo: str, revision: str | None, *, token: str | None, endpoint: str | None,
               timeout: float = 30.0) -> Callable[[Wanted, int], Iterable[bytes]]:
    """Each file from the Hub's resolve URL (following its CDN redirect), from an offset (Range)."""
    import httpx  # noqa: PLC0415
    from huggingface_hub import hf_hub_url  # noqa: PLC0415

    def stream(want: Wanted, offset: int) -> Iterable[bytes]:
        url = hf_hub_url(repo, want.path, revision=revision, endpoint=endpoint)
        headers = {"authorization": f"Bearer {token}"} if token else {}
        if offset:
            headers["range"] = f"bytes={offset}-"
        with httpx.stream("GET", url, headers=headers, follow_redirects=True, timeout=timeout) as response:
            if response.status_code >= 400:
                raise FetchError(f"the Hub answered {response.status_code} for {repo}/{want.path}")
            if offset and response.status_code != 206:
                raise FetchError(f"the Hub ignored the Range request for {repo}/{want.path}")
            yield from response.iter_bytes(_CHUNK)

    return stream
