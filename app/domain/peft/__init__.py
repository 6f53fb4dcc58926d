"""Parameter-efficient fine-tuning as Hugging Face PEFT applies it to a layer graph: LoRA and
DoRA adapters (:mod:`app.domain.peft.lora`) and a 4-bit bitsandbytes base for QLoRA
(:mod:`app.domain.peft.qlora`)."""

from app.domain.peft.lora import (
    NAMINGS,
    LoraBias,
    LoraConfig,
    LoraError,
    LoraKind,
    LoraModule,
    LoraPlan,
    ModuleNaming,
    check_lora_mode,
    linear_modules,
    lora_plan,
    lora_trainable_params,
    module_naming,
    module_rank,
)

__all__ = [
    "NAMINGS",
    "check_lora_mode",
    "LoraBias",
    "LoraConfig",
    "LoraError",
    "LoraKind",
    "LoraModule",
    "LoraPlan",
    "ModuleNaming",
    "linear_modules",
    "lora_plan",
    "lora_trainable_params",
    "module_naming",
    "module_rank",
]
