"""The tiers a fresh installation starts with. Admins edit the rows; no code depends on these numbers."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

DEFAULT_TIER_NAME = "free"

# name: fields. Empty (None) limits mean "no limit". Priority: lower is served first.
DEFAULT_TIERS: dict[str, dict[str, Any]] = {
    "free": {
        "display_name": "Free",
        "is_default": True,
        "all_deployments": False,
        "requests_per_minute": 10,
        "tokens_per_minute": 8_000,
        "tokens_per_day": 50_000,
        "tokens_per_month": 500_000,
        # The default model's whole window: a plan's cap below it refuses what the model could answer.
        "max_context": 8192,
        "max_output_tokens": 512,
        "priority": 4,
    },
    "pro": {
        "display_name": "Pro",
        "all_deployments": False,
        "requests_per_minute": 60,
        "tokens_per_minute": 60_000,
        "tokens_per_day": 1_000_000,
        "tokens_per_month": 20_000_000,
        "max_output_tokens": 2048,
        "priority": 2,
    },
    "enterprise": {
        "display_name": "Enterprise",
        "all_deployments": True,
        "requests_per_minute": 600,
        "tokens_per_minute": 600_000,
        "priority": 1,
    },
    "admin": {"display_name": "Admin", "all_deployments": True, "priority": 0},
}

# The longest system prompt a conversation's settings may give, per plan (added after the first tiers).
DEFAULT_CONVERSATION_PROMPT_CHARS: dict[str, int] = {"free": 1000, "pro": 4000, "enterprise": 8000, "admin": 8000}

# The largest image (bytes as sent, pixels decoded) each plan takes, in a message or as a file (added
# after the first tiers). Pillow refuses past twice its own default of ~89 million pixels; these stay below.
DEFAULT_IMAGE_LIMITS: dict[str, dict[str, int]] = {
    "free": {"max_image_bytes": 5 * 1024 * 1024, "max_image_pixels": 16_000_000},
    "pro": {"max_image_bytes": 10 * 1024 * 1024, "max_image_pixels": 40_000_000},
    "enterprise": {"max_image_bytes": 20 * 1024 * 1024, "max_image_pixels": 80_000_000},
    "admin": {"max_image_bytes": 20 * 1024 * 1024, "max_image_pixels": 80_000_000},
}

# The per-user limits of the lighter endpoints (added after the first tiers, so apart from them:
# the migration that made the tiers knows nothing of these fields).
DEFAULT_ENDPOINT_LIMITS: dict[str, dict[str, int | None]] = {
    "free": {
        "moderations_per_minute": 20,
        "model_lists_per_minute": 60,
        "conversations_per_hour": 60,
        "api_keys_per_day": 10,
    },
    "pro": {
        "moderations_per_minute": 120,
        "model_lists_per_minute": 300,
        "conversations_per_hour": 600,
        "api_keys_per_day": 50,
    },
    "enterprise": {
        "moderations_per_minute": 1200,
        "model_lists_per_minute": 1200,
        "conversations_per_hour": 6000,
        "api_keys_per_day": 200,
    },
    "admin": {},
}

# Files uploaded an hour, processed a day and searched a minute, and every other request a minute:
# apart again, for the migration that added them (0004's knows nothing of these fields).
DEFAULT_FILE_AND_REQUEST_LIMITS: dict[str, dict[str, int | None]] = {
    "free": {
        "file_uploads_per_hour": 20,
        "documents_per_day": 50,
        "file_searches_per_minute": 20,
        "other_requests_per_minute": 600,
    },
    "pro": {
        "file_uploads_per_hour": 120,
        "documents_per_day": 500,
        "file_searches_per_minute": 120,
        "other_requests_per_minute": 1200,
    },
    "enterprise": {
        "file_uploads_per_hour": 1200,
        "documents_per_day": 5000,
        "file_searches_per_minute": 1200,
        "other_requests_per_minute": 3000,
    },
    "admin": {},
}

# (prompt, completion) price per 1,000 tokens on the default deployment.
DEFAULT_PRICES: dict[str, tuple[Decimal, Decimal]] = {
    "free": (Decimal("0"), Decimal("0")),
    "pro": (Decimal("0.000200"), Decimal("0.000600")),
    "enterprise": (Decimal("0.000150"), Decimal("0.000450")),
    "admin": (Decimal("0"), Decimal("0")),
}

# Per 1,000 prompt tokens the engine's prefix cache served (not computed again): a quarter of the
# prompt price. Empty (None in a row) would charge them as any prompt token.
DEFAULT_CACHED_PRICES: dict[str, Decimal] = {name: prompt / 4 for name, (prompt, _) in DEFAULT_PRICES.items()}


def set_default_cached_prices(*, price_model: Any) -> None:
    """The default tiers' cached price where a row has none and still has the default prompt price."""
    for name, cached in DEFAULT_CACHED_PRICES.items():
        price_model.objects.filter(
            tier__name=name, prompt_price_per_1k=DEFAULT_PRICES[name][0], cached_prompt_price_per_1k=None
        ).update(cached_prompt_price_per_1k=cached)


# Price per 1,000 input tokens on the embedding deployment (it has no output tokens). Tiers that
# include only chosen deployments (free, pro) get it added; the others have every deployment.
DEFAULT_EMBEDDING_PRICES: dict[str, Decimal] = {
    "free": Decimal("0"),
    "pro": Decimal("0.000020"),
    "enterprise": Decimal("0.000015"),
    "admin": Decimal("0"),
}


def create_embedding_prices(*, tier_model: Any, price_model: Any, deployment: Any) -> None:
    """The default tiers' access to and prices on the embedding `deployment`, where missing."""
    for tier in tier_model.objects.filter(name__in=DEFAULT_EMBEDDING_PRICES):
        tier.deployments.add(deployment)
        price_model.objects.get_or_create(
            tier=tier, deployment=deployment, defaults={"prompt_price_per_1k": DEFAULT_EMBEDDING_PRICES[tier.name]}
        )


def create_default_tiers(*, tier_model: Any, price_model: Any, deployment: Any | None) -> None:
    """Create the default tiers (and their prices on `deployment`) where missing; used by a migration."""
    known = {field.name for field in tier_model._meta.get_fields()}
    for name, fields in DEFAULT_TIERS.items():
        every_limit = {
            **DEFAULT_ENDPOINT_LIMITS[name],
            **DEFAULT_FILE_AND_REQUEST_LIMITS[name],
            "conversation_prompt_chars": DEFAULT_CONVERSATION_PROMPT_CHARS[name],
            **DEFAULT_IMAGE_LIMITS[name],
        }
        limits = {field: value for field, value in every_limit.items() if field in known}
        tier, _ = tier_model.objects.get_or_create(name=name, defaults={**fields, **limits})
        if deployment is not None:
            tier.deployments.add(deployment)
            prompt, completion = DEFAULT_PRICES[name]
            price_model.objects.get_or_create(
                tier=tier,
                deployment=deployment,
                defaults={"prompt_price_per_1k": prompt, "completion_price_per_1k": completion},
            )
    if "cached_prompt_price_per_1k" in {field.name for field in price_model._meta.get_fields()}:
        set_default_cached_prices(price_model=price_model)


DEPLOYMENT_MANAGER_PERMISSIONS = [
    ("inference", "view_modeldeployment"),
    ("inference", "add_modeldeployment"),
    ("inference", "change_modeldeployment"),
    ("inference", "view_generation"),
]


def create_staff_groups(*, group_model: Any, permission_model: Any) -> None:
    """The Moderators (the review queue) and Deployment managers groups with their permissions; the
    models are passed in so a migration can use its historical ones. Permissions must exist already."""
    moderators, _ = group_model.objects.get_or_create(name="Moderators")
    moderators.permissions.add(
        permission_model.objects.get(content_type__app_label="accounts", codename="review_moderation")
    )
    managers, _ = group_model.objects.get_or_create(name="Deployment managers")
    for app_label, codename in DEPLOYMENT_MANAGER_PERMISSIONS:
        managers.permissions.add(permission_model.objects.get(content_type__app_label=app_label, codename=codename))


# What one file's processing may take, per plan (documents.TierDocumentLimits; docs/documents.md):
# what an archive may unpack to, PDF pages, paragraphs, passages, seconds and MiB of memory.
# None: no limit, except for the time and memory, which every file has.
MB = 1024 * 1024
DEFAULT_DOCUMENT_PROCESSING_LIMITS: dict[str, dict[str, int | None]] = {
    "free": {
        "max_unpacked_bytes": 50 * MB,
        "max_pages": 300,
        "max_paragraphs": 20_000,
        "max_chunks": 2_000,
        "processing_seconds": 60,
        "processing_memory_mb": 512,
    },
    "pro": {
        "max_unpacked_bytes": 250 * MB,
        "max_pages": 2_000,
        "max_paragraphs": 100_000,
        "max_chunks": 10_000,
        "processing_seconds": 300,
        "processing_memory_mb": 1024,
    },
    "enterprise": {
        "max_unpacked_bytes": 1024 * MB,
        "max_pages": 5_000,
        "max_paragraphs": 250_000,
        "max_chunks": 25_000,
        "processing_seconds": 600,
        "processing_memory_mb": 2048,
    },
    "admin": {
        "max_unpacked_bytes": None,
        "max_pages": None,
        "max_paragraphs": None,
        "max_chunks": None,
        "processing_seconds": 600,
        "processing_memory_mb": 2048,
    },
}
