"""gym-tf: Training-Free GRPO. Learn an experience library for a frozen LLM, record it, and serve it."""

__version__ = "0.1.0"
