"""Allocator settings for dynamic batch shapes (expandable segments) and per-step memory telemetry."""

from workbench.memory.allocator import (AllocatorRuntime, AllocatorStatus, configure_allocator,
                                        current_allocator_settings, preview_configure_allocator,
                                        switch_expandable_segments, torch_runtime)
from workbench.memory.settings import format_settings, merge_settings, parse_settings
from workbench.memory.telemetry import MemoryRecorder, device_alloc_events, step_record, summarize_steps

__all__ = ["AllocatorRuntime", "AllocatorStatus", "configure_allocator", "current_allocator_settings",
           "preview_configure_allocator", "switch_expandable_segments",
           "torch_runtime", "format_settings", "merge_settings", "parse_settings", "MemoryRecorder",
           "step_record", "summarize_steps", "device_alloc_events"]
