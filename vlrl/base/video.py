"""Videos -> the frames a model sees, sampled at `[data] video_fps` and at most `max_frames`, with what the processor
needs to place them in time (`metadata`: the source's frame rate and each kept frame's index); and frames -> an mp4.

A row's video is a file (mp4, webm, anything FFmpeg reads), decoded with PyAV (`av`: FFmpeg bundled in its wheel;
docs/design.md says why it and not torchcodec), or a list of frames (any image form `vlrl.base.images.load_image`
reads), taken as shot at `video_fps`. What cannot be used is a `BadItem` with a reason the loaders count
(`video_not_found`, `video_unreadable`, `video_no_frames`, `video_path_outside_dataset`), never a crash.

    >>> sample_indices(10, source_fps=10.0, video_fps=2.0, max_frames=0)
    [0, 5]
    >>> sample_indices(300, source_fps=30.0, video_fps=2.0, max_frames=8)
    [0, 43, 85, 128, 171, 214, 256, 299]
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from vlrl.base.images import BadItem, load_image

VIDEO_SUFFIXES = (".mp4", ".webm", ".mkv", ".mov", ".avi", ".m4v", ".gif")


def is_video_file(value) -> bool:
    """A value naming a video file (a path string ending in a video suffix) rather than a list of frames.

    >>> is_video_file("clips/a.mp4"), is_video_file(["f0.png", "f1.png"]), is_video_file({"path": "a.webm"})
    (True, False, True)
    """
    if isinstance(value, dict):
        value = value.get("path")
    return isinstance(value, (str, Path)) and Path(str(value)).suffix.lower() in VIDEO_SUFFIXES


def sample_indices(total: int, *, source_fps: float, video_fps: float, max_frames: int) -> list[int]:
    """The frames kept of `total` shot at `source_fps`: one every 1 / `video_fps` seconds, from the first frame; past
    `max_frames` (0: no cap) that many spread evenly over the whole clip, first and last included."""
    if total <= 0:
        return []
    step = source_fps / video_fps if video_fps > 0 and source_fps > 0 else 1.0
    indices = sorted({min(total - 1, round(k * step)) for k in range(max(1, int((total - 1) / step) + 1))})
    if max_frames and len(indices) > max_frames:
        indices = [round(k * (total - 1) / max(1, max_frames - 1)) for k in range(max_frames)]
    return indices


def _video_path(value, root) -> Path:
    path = Path(str(value.get("path") if isinstance(value, dict) else value))
    base = Path(root or ".").resolve()
    resolved = (base / path).resolve()
    if path.is_absolute() or not resolved.is_relative_to(base):
        raise BadItem("video_path_outside_dataset", f"{str(path)!r} resolves outside {base}")
    if not resolved.is_file():
        raise BadItem("video_not_found", str(path))
    return resolved


def read_video(value, *, video_fps: float, max_frames: int, root: str | Path | None = None) -> tuple[list, dict]:
    """A video file, or a list of frames, -> (the kept frames as RGB PIL images, their metadata).

    The metadata is what Qwen-VL's video processor places frames in time by (`transformers.video_utils.VideoMetadata`
    fields): `fps` (the source's; a list of frames: `video_fps`), `total_num_frames`, `frames_indices` (of the kept
    frames, in the source), `duration` (seconds), and `source` (the file's path as given, or "frames").

    Raises:
        BadItem: video_not_found, video_path_outside_dataset, video_unreadable (no decoder reads it, or it breaks
            mid-stream), video_no_frames (it decodes to nothing); a list of frames: the image reasons of `load_image`.
    """
    if not is_video_file(value):
        frames = [load_image(frame, root=root) for frame in (value or [])]
        if not frames:
            raise BadItem("video_no_frames", "an empty list of frames")
        keep = sample_indices(len(frames), source_fps=video_fps, video_fps=video_fps, max_frames=max_frames)
        return [frames[i] for i in keep], {"fps": float(video_fps), "total_num_frames": len(frames),
                                           "frames_indices": keep, "duration": len(frames) / video_fps,
                                           "source": "frames"}
    path = _video_path(value, root)
    av = _av()

    frames, times = [], []
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise BadItem("video_no_frames", f"{path.name}: no video stream")
            stream = container.streams.video[0]
            source_fps = float(stream.average_rate or stream.guessed_rate or 0) or video_fps
            for frame in container.decode(stream):  # one pass; only kept frames are converted (below)
                frames.append(frame)
                times.append(frame.time)
    except av.error.FFmpegError as err:
        raise BadItem("video_unreadable", f"{path.name}: {err}") from None
    if not frames:
        raise BadItem("video_no_frames", f"{path.name} decodes to no frame")
    keep = sample_indices(len(frames), source_fps=source_fps, video_fps=video_fps, max_frames=max_frames)
    return [frames[i].to_image() for i in keep], {"fps": source_fps, "total_num_frames": len(frames),
                                                  "frames_indices": keep, "duration": len(frames) / source_fps,
                                                  "source": str(value.get("path") if isinstance(value, dict) else value)}


def _av():
    try:
        import av
    except ImportError:
        raise ImportError("decoding and writing videos needs PyAV: pip install 'vlrl[video]'") from None
    return av


def write_video(frames: list, path: str | Path, *, fps: float) -> Path:
    """Writes RGB frames (PIL images of one even size) as an H.264 mp4 at `fps` frames per second (`yuv420p`, the
    form every player reads). Returns the path. Written beside it under a name of this process's own, then moved into
    place: two runs writing the same generated clip at once never read each other's half-written file, and a write
    that fails partway leaves nothing behind (its part file removed, the error raised)."""
    av = _av()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.part")
    try:
        with av.open(str(part), "w", format="mp4") as container:
            stream = container.add_stream("libx264", rate=round(fps))
            stream.width, stream.height = frames[0].size
            stream.pix_fmt = "yuv420p"
            stream.options = {"crf": "18"}  # near lossless: a moved shape stays where it was drawn
            for frame in frames:
                for packet in stream.encode(av.VideoFrame.from_image(frame.convert("RGB"))):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)  # moved into place already, or half-written
    return path
