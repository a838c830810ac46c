"""PyAV against torchcodec on this machine's CPU: 16 frames sampled from one clip, mp4 (H.264) and webm (VP9), the
mean of 5 decodes after a warm-up (docs/design.md's Stack quotes the numbers; why vlrl decodes with PyAV).

    OMP_NUM_THREADS=1 python scripts/video_decoders.py --frames 64 --size 256 --fps 8
    OMP_NUM_THREADS=1 python scripts/video_decoders.py --frames 300 --size 480 --fps 30

torchcodec needs FFmpeg's shared libraries on the loader's path (its wheel carries none); where the system has none,
point LD_LIBRARY_PATH at a folder of links to the ones inside PyAV's wheel (av.libs/), named as FFmpeg names them.
"""

import argparse
import tempfile
import time
from pathlib import Path

from PIL import Image, ImageDraw

from vlrl.base.video import write_video


def clip(frames: int, size: int) -> list:
    out = []
    for i in range(frames):
        frame = Image.new("RGB", (size, size), "white")
        x = 10 + i * (size - 40) // frames
        ImageDraw.Draw(frame).rectangle([x, size // 2, x + 30, size // 2 + 30], fill="red")
        out.append(frame)
    return out


def with_pyav(path: str, keep: list[int]) -> int:
    import av

    wanted, kept = set(keep), 0
    with av.open(path) as container:
        for index, frame in enumerate(container.decode(container.streams.video[0])):
            if index in wanted:
                frame.to_ndarray(format="rgb24")
                kept += 1
    return kept


def with_torchcodec(path: str, keep: list[int]) -> int:
    from torchcodec.decoders import VideoDecoder

    return len(VideoDecoder(path).get_frames_at(keep).data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=64)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--fps", type=int, default=8)
    args = parser.parse_args()
    keep = [round(i * (args.frames - 1) / 15) for i in range(16)]
    folder = Path(tempfile.mkdtemp())
    frames = clip(args.frames, args.size)
    write_video(frames, folder / "clip.mp4", fps=args.fps)
    import av  # the webm: VP9, written the same way

    with av.open(str(folder / "clip.webm"), "w") as container:
        stream = container.add_stream("libvpx-vp9", rate=args.fps)
        stream.width = stream.height = args.size
        stream.pix_fmt = "yuv420p"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_image(frame)):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    for name, decode in (("pyav", with_pyav), ("torchcodec", with_torchcodec)):
        for suffix in ("mp4", "webm"):
            path = str(folder / f"clip.{suffix}")
            try:
                assert decode(path, keep) == 16
                started = time.perf_counter()
                for _ in range(5):
                    decode(path, keep)
                print(f"{name} {suffix}: {(time.perf_counter() - started) / 5 * 1000:.1f} ms for 16 frames")
            except (ImportError, RuntimeError, OSError) as err:  # torchcodec without FFmpeg: said, not raised
                print(f"{name} {suffix}: failed: {type(err).__name__}: {str(err).splitlines()[0][:160]}")


if __name__ == "__main__":
    main()
