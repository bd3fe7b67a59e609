"""The structured config schema: every key a run accepts, with its type.

Hydra merges the YAML files under ``conf/`` onto these dataclasses, so a
misspelled key or a value of the wrong type fails at compose time, before
anything is loaded. Value *ranges* (multiples of 8, positive counts, ...) are
checked in :mod:`sdjax_runner.plan`. The YAML files document each key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


class Dtype(Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class ParallelMode(Enum):
    pmap = "pmap"  # the guide's path: replicate + shard + jax.pmap
    sharded = "sharded"  # one jax.jit over a Mesh("data"), NamedSharding params and batch


class PromptFill(Enum):
    cycle = "cycle"  # repeat the prompt list to fill the last batch; every image is kept
    pad = "pad"  # fill the last batch with copies too, but drop those images from the outputs


class PredictionType(Enum):
    epsilon = "epsilon"  # the UNet predicts the noise (SD 1.x, SD 2.x base, SDXL)
    v_prediction = "v_prediction"  # the UNet predicts v (SD 2.x 768)
    sample = "sample"


class Attention(Enum):
    default = "default"  # diffusers' FlaxAttention as shipped
    split_head_dim = "split_head_dim"  # diffusers' option: heads as their own axis
    memory_efficient = "memory_efficient"  # diffusers' chunked attention
    dot_product = "dot_product"  # jax.nn.dot_product_attention, XLA implementation
    cudnn_flash = "cudnn_flash"  # jax.nn.dot_product_attention on cuDNN flash attention (NVIDIA, bf16)


class TrackingBackend(Enum):
    mlflow = "mlflow"
    none = "none"


@dataclass
class ModelConfig:
    name: str = MISSING
    pretrained_model_name_or_path: str = MISSING
    revision: Optional[str] = None
    variant: Optional[str] = None
    safety_checker: bool = False
    builtin: Optional[str] = None
    resolution: Optional[int] = None
    prediction_type: Optional[PredictionType] = None
    allow_pickle: bool = False


@dataclass
class DtypeConfig:
    name: str = MISSING
    weights_dtype: Dtype = Dtype.float32
    activations_dtype: Dtype = Dtype.float32


@dataclass
class SchedulerConfig:
    name: str = MISSING
    config_overrides: Dict[str, Any] = field(default_factory=dict)


@dataclass
class PromptsConfig:
    name: str = MISSING
    texts: List[str] = field(default_factory=list)
    file: Optional[str] = None
    negative: Optional[str] = None
    fill: PromptFill = PromptFill.cycle


@dataclass
class SamplingConfig:
    num_inference_steps: int = 50
    guidance_scale: float = 7.5
    height: Optional[int] = None
    width: Optional[int] = None


@dataclass
class DistributedConfig:
    enabled: bool = False
    coordinator_address: Optional[str] = None
    num_processes: Optional[int] = None
    process_id: Optional[int] = None


@dataclass
class ParallelismConfig:
    mode: ParallelMode = ParallelMode.pmap
    num_devices: Optional[int] = None
    per_device_batch_size: int = 1
    num_batches: Optional[int] = None
    host_device_count: Optional[int] = None
    distributed: DistributedConfig = field(default_factory=DistributedConfig)


@dataclass
class TrackingConfig:
    backend: TrackingBackend = TrackingBackend.mlflow
    uri: Optional[str] = None
    experiment_name: str = "sdjax-runner"
    max_retries: int = 2
    backoff_factor: int = 1
    timeout_s: int = 10


@dataclass
class OutputConfig:
    save_images: bool = True
    grid: bool = True
    grid_rows: Optional[int] = None
    grid_cols: Optional[int] = None


@dataclass
class TimingConfig:
    repeats: int = 3


@dataclass
class ReuseConfig:
    max_models: int = 1


@dataclass
class CompilationCacheConfig:
    enabled: bool = True
    dir: str = MISSING
    min_compile_time_s: float = 0.0


@dataclass
class PerformanceConfig:
    attention: Attention = Attention.default
    peak_tflops_per_device: Optional[float] = None
    gpu_memory_fraction: Optional[float] = None
    gpu_autotune_level: Optional[int] = None
    xla_flags: List[str] = field(default_factory=list)


@dataclass
class PathsConfig:
    output_root: str = "outputs"
    cache_dir: str = MISSING


@dataclass
class RunConfig:
    model: ModelConfig = MISSING
    dtype: DtypeConfig = MISSING
    scheduler: SchedulerConfig = MISSING
    prompts: PromptsConfig = MISSING
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    reuse: ReuseConfig = field(default_factory=ReuseConfig)
    compilation_cache: CompilationCacheConfig = field(default_factory=CompilationCacheConfig)
    performance: PerformanceConfig = field(default_factory=PerformanceConfig)
    seed: int = 0
    run_name: str = MISSING
    experiment: Optional[str] = None


def register() -> None:
    """Register the schema so ``conf/config.yaml`` can list it first in its defaults."""
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
