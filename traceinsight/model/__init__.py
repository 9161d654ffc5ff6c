"""The common model: event schema, interval algebra and kernel classification."""

from traceinsight.model.schema import (
    COLUMNS,
    EVENT_SCHEMA,
    GPU_ACTIVITY_KINDS,
    GPU_KINDS,
    KERNEL_CLASSES,
    KINDS,
    DeviceInfo,
    Trace,
    TraceMeta,
    conform,
    empty_events,
)

__all__ = [
    "COLUMNS",
    "EVENT_SCHEMA",
    "GPU_ACTIVITY_KINDS",
    "GPU_KINDS",
    "KERNEL_CLASSES",
    "KINDS",
    "DeviceInfo",
    "Trace",
    "TraceMeta",
    "conform",
    "empty_events",
]
