"""Full-size Stable Diffusion, FLUX.1, SD 3.5 and FLUX.2 [klein] on one accelerator: compile time, seconds per batch, images/s, MFU.

    python benchmarks/full_size.py --out docs/full_size.json

Needs a GPU or TPU (a full-size UNet step takes ~44 s on 2 CPU cores). Uses the built-in
random-weight architectures (model=sd-v1-arch, model=sdxl-arch: the exact shapes, no hub needed),
built on first use into $SDJAX_RUNNER_CACHE_DIR. Every part is one ``python -m sdjax_runner -m``
process; parts A and B share a fresh persistent compilation cache, so B's compile is the warm one.
They run in the order G, H, J, K, A, E, B, F, C, I, D (the numbers still missing first), and --out is rewritten
after each, so a call cut off by a device's time limit keeps what it finished (--log: every sweep's output).

  A. SD-1.x, bf16 (--dtype), 512x512, 50 PNDM steps, guidance 7.5, 8 images as one batch on one device,
     for each attention implementation (--attention).
  B. A again in a new process (first attention only): compile from the persistent cache.
  C. The best attention of A at larger per-device batches (--batches): the best throughput.
  D. SDXL, bf16 (--dtype), 1024x1024, 20 Euler steps (--xl-batches), best attention of A.
  E. (--profile) A's best configuration once more with performance.profile=true: device time per
     text encoder / UNet / VAE, the top kernels and each trace line's time the program's instructions
     account for (profile.json, engine/profiling.py); with --out, the trace beside it (NAME_trace.json.gz).
  G. FLUX.1 [dev] (model=flux-dev-arch: its exact shapes, random bf16 weights, ~34 GB built once), bf16,
     1024x1024, 28 flow-matching Euler steps, guidance 3.5, 512 T5 tokens, 1 image per batch (--flux-batches),
     attention default and cudnn_flash (--flux-attention); --skip-flux leaves it out. Needs ~40 GB of device
     memory (an H100 or H200).
  H. SD 3.5 Large (model=sd3.5-large-arch: its exact shapes, random bf16 weights, ~28 GB built once), bf16,
     1024x1024, 28 flow-matching Euler steps, guidance 3.5 (its model card's), 256 T5 tokens, 1 image per batch
     (--sd3-batches), attention default and cudnn_flash (--sd3-attention); --skip-sd3 leaves it out. Needs ~40 GB
     of device memory (an H100 or H200).
  J. The speed-quality frontier on FLUX.1 [dev] (issue #62): G's settings (first attention of --flux-attention, one
     image) with First-Block Cache at threshold 0.08 (ParaAttention's FLUX.1-dev point) and int8 weights (Qwix,
     weight-only), each against the plain run (PSNR/SSIM against it, the skipped calls, the executed FLOPs, each
     device's bytes of the transformer): cache=none,first_block x quantize=none,int8, one model load; --skip-frontier
     leaves it out.
  K. FLUX.2 [klein] 4B (model=flux2-klein-4b-arch: its exact shapes, random bf16 weights, ~16 GB built once), bf16,
     1024x1024, 4 flow-matching Euler steps without guidance (the distilled model's), 512 chat tokens, 1 image per
     batch (--klein-batches), attention default and cudnn_flash (--klein-attention); --skip-klein leaves it out.
  I. A1111's Hires. fix on SD-1.x: --sd-size, then 2x (1024x1024 by default), DPM++ 2M Karras, 20 steps each pass
     (--hires-steps), strength 0.7, latent (bilinear) and Lanczos upscalers, --hires-batches images, best attention
     of A; --skip-hires leaves it out.
  F. (--xla-flag-sets) A's best configuration once per set of XLA flags, each in a new process
     (XLA reads its flags once per process), the first set usually '' (none) as the baseline, so the
     ratios are measured side by side in one call. E.g.:
         --xla-flag-sets '' '--xla_gpu_enable_triton_gemm=false' '--xla_gpu_enable_command_buffer='
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import machine_facts, run_sweep

FIELDS = ("performance.attention", "per_device_batch_size", "images_per_batch", "compile_s", "trace_s",
          "compile_cache_hit", "generate_s", "images_per_s", "flops_per_batch", "tflops_per_s", "mfu",
          "device_memory_peak_bytes", "load_s")


def point(job: dict) -> dict:
    def given(key: str, default):
        return next((line.split("=", 1)[1] for line in job["overrides"].splitlines() if f"{key}=" in line), default)

    hires = given("sampling.hires.upscaler", None)
    return {"performance.attention": given("performance.attention", "default"), **{k: job.get(k) for k in FIELDS[1:]},
            **({"sampling.hires.upscaler": hires} if hires else {})}


def frontier_point(job: dict) -> dict:
    """Part J's point: :func:`point`, the cache and quantizer it ran, what they did (calls skipped, the transformer's
    bytes on the device) and what they cost (PSNR, SSIM against the plain run)."""
    def given(key: str) -> str:
        return next((line.split("=", 1)[1] for line in job["overrides"].splitlines() if f"- {key}=" in line), "none")

    return {**point(job), "cache": given("cache"), "quantize": given("quantize"),
            **{k: job.get(k) for k in ("denoiser_calls", "denoiser_calls_skipped", "denoiser_param_bytes_per_device")},
            **{k: job["quality"].get(k) for k in ("psnr", "psnr_min", "ssim_mean", "ssim_min")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attention", nargs="+", default=["default", "split_head_dim", "cudnn_flash"])
    parser.add_argument("--batches", type=int, nargs="*", default=[16, 32], help="part C (none: no part C)")
    parser.add_argument("--xl-batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"],
                        help="weights and activations of every part (fp16: NVIDIA GPUs; the peak is bf16's)")
    parser.add_argument("--skip-sd", action="store_true", help="leave SD-1.x out: parts A, B, C, E, F and I")
    parser.add_argument("--skip-xl", action="store_true")
    parser.add_argument("--skip-flux", action="store_true")
    parser.add_argument("--flux-model", default="flux-dev-arch")
    parser.add_argument("--flux-size", type=int, default=1024)
    parser.add_argument("--flux-steps", type=int, default=28)
    parser.add_argument("--flux-batches", type=int, nargs="+", default=[1])
    parser.add_argument("--flux-attention", nargs="+", default=["default", "cudnn_flash"])
    parser.add_argument("--flux-tokens", type=int, default=512, help="prompts.max_sequence_length of part G")
    parser.add_argument("--skip-sd3", action="store_true")
    parser.add_argument("--sd3-model", default="sd3.5-large-arch")
    parser.add_argument("--sd3-size", type=int, default=1024)
    parser.add_argument("--sd3-steps", type=int, default=28)
    parser.add_argument("--sd3-batches", type=int, nargs="+", default=[1])
    parser.add_argument("--sd3-attention", nargs="+", default=["default", "cudnn_flash"])
    parser.add_argument("--sd3-tokens", type=int, default=256, help="prompts.max_sequence_length of part H")
    parser.add_argument("--skip-frontier", action="store_true", help="leave part J out")
    parser.add_argument("--skip-klein", action="store_true", help="leave part K out")
    parser.add_argument("--klein-model", default="flux2-klein-4b-arch")
    parser.add_argument("--klein-size", type=int, default=1024)
    parser.add_argument("--klein-steps", type=int, default=4)
    parser.add_argument("--klein-batches", type=int, nargs="+", default=[1])
    parser.add_argument("--klein-attention", nargs="+", default=["default", "cudnn_flash"])
    parser.add_argument("--klein-tokens", type=int, default=512, help="prompts.max_sequence_length of part K")
    parser.add_argument("--frontier-threshold", type=float, default=0.08, help="part J: First-Block Cache's threshold")
    parser.add_argument("--skip-hires", action="store_true")
    parser.add_argument("--hires-steps", type=int, default=20,
                        help="part I: each pass's steps (A1111's 20 and Hires steps 0), SD-1.x at --sd-size, upscaled 2x")
    parser.add_argument("--hires-batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--profile", action="store_true", help="part E: where A's best configuration spends its time")
    parser.add_argument("--xla-flag-sets", nargs="+", default=[], metavar="FLAGS",
                        help="part F: A's best configuration under each set of XLA flags (space-separated, '' for none)")
    # For a dry run of the script itself on a CPU: --sd-model tiny-random --xl-model tiny-random-xl
    # --sd-size 64 --xl-size 64 --steps 2 --xl-steps 2 --attention default dot_product --batches 2
    # --flux-model tiny-random-flux --flux-size 32 --flux-steps 2 --flux-attention default --flux-tokens 16
    # --sd3-model tiny-random-sd3 --sd3-size 32 --sd3-steps 2 --sd3-attention default --sd3-tokens 16 --hires-steps 2
    # --klein-model tiny-random-flux2 --klein-size 32 --klein-steps 2 --klein-attention default --klein-tokens 48
    parser.add_argument("--sd-model", default="sd-v1-arch")
    parser.add_argument("--xl-model", default="sdxl-arch")
    parser.add_argument("--sd-size", type=int, default=512)
    parser.add_argument("--xl-size", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--xl-steps", type=int, default=20)
    parser.add_argument("--out", type=Path, help="the report, rewritten after each part (a cut-off run keeps its parts)")
    parser.add_argument("--log", type=Path, help="every sweep's output, appended as it comes")
    # An XLA flag is a value of --xla-flag-sets, not an option of this script: argparse takes a word with a space
    # for a value, and each set is split on spaces later anyway.
    args = parser.parse_args([f" {word}" if word.startswith("--xla_") else word for word in sys.argv[1:]])

    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    # Not machine_facts(with_devices=True): JAX in this process would take the GPU's memory from the runs.
    report: dict = {"machine": machine_facts(), "dtype": args.dtype}

    def save() -> None:  # after every part: a run cut off by a time limit keeps the parts it finished
        if args.out:
            args.out.write_text(json.dumps(report, indent=1) + "\n")

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        common = [f"dtype={args.dtype}", "tracking=none", "parallelism=sharded", "parallelism.num_devices=1",
                  f"timing.repeats={args.repeats}", "timing.max_extra_share=null",  # exact medians of `repeats` calls
                  "output.grid=false", "output.save_images=false", f"compilation_cache.dir={work / 'xla'}"]

        def sweep(overrides: list[str], part: str, images: bool = False) -> list[dict]:
            """``images``: the images written (a sweep judged against its reference point reads them)."""
            base = [o for o in common if not (images and o.startswith("output.save_images="))]
            return run_sweep(base + overrides, work / part, env, cwd=work, log=args.log)

        flow_parts(args, sweep, report, save)  # first: the largest models, the numbers still missing
        if not args.skip_sd:
            sd_parts(args, sweep, work, report, save)
        if not args.skip_xl:
            xl = [f"model={args.xl_model}", "scheduler=euler", f"sampling.height={args.xl_size}",
                  f"sampling.width={args.xl_size}", f"sampling.num_inference_steps={args.xl_steps}",
                  f"performance.attention={report.get('best_sd_attention', args.attention[0])}",
                  "parallelism.per_device_batch_size=" + ",".join(map(str, args.xl_batches))]
            report["D_sdxl_1024_20_euler"] = [point(j) for j in sweep(xl, "d")]
            save()
    print(json.dumps(report, indent=1))


def flow_parts(args, sweep, report: dict, save) -> None:
    """G (FLUX.1 [dev]) and H (SD 3.5 Large), each at both attentions; guidance 3.5: FLUX.1 [dev]'s default,
    SD 3.5 Large's card's; J (FLUX.1's frontier) and K (FLUX.2 [klein] 4B)."""
    for part, name, prefix in (("g", "G_flux_dev_1024_28_steps", "flux"), ("h", "H_sd35_large_1024_28_steps", "sd3")):
        if getattr(args, f"skip_{prefix}"):
            continue
        size = getattr(args, f"{prefix}_size")
        flow = [f"model={getattr(args, f'{prefix}_model')}", f"sampling.height={size}", f"sampling.width={size}",
                f"sampling.num_inference_steps={getattr(args, f'{prefix}_steps')}", "sampling.guidance_scale=3.5",
                f"prompts.max_sequence_length={getattr(args, f'{prefix}_tokens')}",
                "performance.attention=" + ",".join(getattr(args, f"{prefix}_attention")),
                "parallelism.per_device_batch_size=" + ",".join(map(str, getattr(args, f"{prefix}_batches")))]
        report[name] = [point(j) for j in sweep(flow, part)]
        save()
    if not (args.skip_flux or args.skip_frontier):
        size = args.flux_size
        frontier = [f"model={args.flux_model}", f"sampling.height={size}", f"sampling.width={size}",
                    f"sampling.num_inference_steps={args.flux_steps}", "sampling.guidance_scale=3.5",
                    f"prompts.max_sequence_length={args.flux_tokens}", f"performance.attention={args.flux_attention[0]}",
                    "cache=none,first_block", f"cache.threshold={args.frontier_threshold}", "quantize=none,int8",
                    "+metrics.reference_point={cache:none,quantize:none}"]
        report["J_flux_dev_frontier_cache_and_int8"] = [frontier_point(j) for j in sweep(frontier, "j", images=True)]
        save()
    if not args.skip_klein:  # a distilled klein: no guidance to set
        size = args.klein_size
        klein = [f"model={args.klein_model}", f"sampling.height={size}", f"sampling.width={size}",
                 f"sampling.num_inference_steps={args.klein_steps}", f"prompts.max_sequence_length={args.klein_tokens}",
                 "performance.attention=" + ",".join(args.klein_attention),
                 "parallelism.per_device_batch_size=" + ",".join(map(str, args.klein_batches))]
        report["K_flux2_klein_4b_1024_4_steps"] = [point(j) for j in sweep(klein, "k")]
        save()


def sd_parts(args, sweep, work: Path, report: dict, save) -> None:
    """SD-1.x: A (each attention), B (A's first in a new process, warm cache), C (batch sizes), E (profile),
    F (XLA flag sets) and I (Hires. fix)."""
    sd = [f"model={args.sd_model}", "scheduler=pndm", f"sampling.height={args.sd_size}",
          f"sampling.width={args.sd_size}", f"sampling.num_inference_steps={args.steps}", "sampling.guidance_scale=7.5"]
    eight = ["parallelism.per_device_batch_size=8"]
    part_a = sweep(sd + eight + ["performance.attention=" + ",".join(args.attention)], "a")
    report["A_sd_512_50_steps_8_images"] = [point(j) for j in part_a]
    report["machine"].update(device_kind=part_a[0]["device_kind"], backend=part_a[0]["backend"])
    best = min(report["A_sd_512_50_steps_8_images"], key=lambda p: p["generate_s"])["performance.attention"]
    report["best_sd_attention"] = best
    save()
    if args.profile:  # second: the H200's unexplained time is read from this trace
        sweep(sd + eight + [f"performance.attention={best}", "performance.profile=true"], "e")
        profile = json.loads((work / "e" / "0" / "profile.json").read_text())
        report["E_profile"] = dict({k: v for k, v in profile.items() if k != "trace"}, attention=best)
        if args.out:  # the trace itself, for Perfetto / XProf: OUT's name + _trace.json.gz
            shutil.copyfile(work / "e" / "0" / profile["trace"], args.out.with_name(args.out.stem + "_trace.json.gz"))
        save()
    report["B_same_new_process_warm_cache"] = [point(j) for j in sweep(
        sd + eight + [f"performance.attention={args.attention[0]}"], "b")]
    save()
    flag_sets = []
    for number, flags in enumerate(args.xla_flag_sets):
        listed = ",".join(f"'{flag}'" for flag in flags.split())
        [job] = sweep(sd + eight + [f"performance.attention={best}", f"performance.xla_flags=[{listed}]"], f"f{number}")
        flag_sets.append(dict(point(job), xla_flags=flags.strip()))
        report["F_xla_flag_sets"] = flag_sets
        save()
    if args.batches:
        report["C_batch_sizes"] = [point(j) for j in sweep(
            sd + [f"performance.attention={best}", "parallelism.per_device_batch_size=" + ",".join(map(str, args.batches))],
            "c")]
        save()
    if not args.skip_hires:  # A1111's Hires. fix: latent (bilinear) and Lanczos upscalers, strength 0.7
        hires = [f"model={args.sd_model}", "sampler=DPM++ 2M Karras", f"sampling.height={args.sd_size}",
                 f"sampling.width={args.sd_size}", f"sampling.num_inference_steps={args.hires_steps}",
                 "sampling.guidance_scale=7.5", "sampling.hires.scale=2", "sampling.hires.upscaler=latent,lanczos",
                 f"performance.attention={best}",
                 "parallelism.per_device_batch_size=" + ",".join(map(str, args.hires_batches))]
        report["I_sd_hires_fix_2x"] = [point(j) for j in sweep(hires, "i")]
        save()

if __name__ == "__main__":
    main()
