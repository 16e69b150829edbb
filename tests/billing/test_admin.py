"""The tier's admin page: its models (a list inference keeps) and its prices (billing's rows), edited
from the tier's side as before they moved out of accounts."""

from __future__ import annotations

from decimal import Decimal

from django.urls import reverse

from accounts.models import Tier
from billing.models import TierModelPrice
from inference.models import ModelDeployment


def _form(page) -> dict:
    """The change form's fields as the page filled them in, ready to post back."""
    form = page.context["adminform"].form
    data = {}
    for name in form.fields:
        value = form[name].value()
        if value is None:
            continue
        if isinstance(value, list):
            data[name] = [str(v) for v in value]
        elif isinstance(value, bool):
            if value:
                data[name] = "on"
        else:
            data[name] = str(value)
    for formset in page.context["inline_admin_formsets"]:
        management = formset.formset.management_form
        for name in management.fields:
            data[f"{management.prefix}-{name}"] = management[name].value()
        for index, inline in enumerate(formset.formset.forms):
            for name in inline.fields:
                value = inline[name].value()
                if value is not None:
                    data[f"{formset.formset.prefix}-{index}-{name}"] = str(value)
    return data


def test_the_tier_page_shows_and_edits_its_models_and_prices(admin_client, default_deployment):
    deployment = default_deployment
    tier = Tier.objects.get(name="free")
    url = reverse("admin:accounts_tier_change", args=[tier.id])
    page = admin_client.get(url)
    assert page.status_code == 200
    shown = set(page.context["adminform"].form["deployments"].value())
    assert shown == set(tier.deployments.values_list("id", flat=True)) and deployment.id in shown
    assert page.context["inline_admin_formsets"][0].formset.model is TierModelPrice

    other = ModelDeployment.objects.create(name="other-model", model="other")
    data = _form(page)
    data["deployments"] = [str(other.id)]
    data["prices-0-prompt_price_per_1k"] = "0.5"
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert list(tier.deployments.all()) == [other]
    assert TierModelPrice.objects.get(tier=tier, deployment=deployment).prompt_price_per_1k == Decimal("0.5")
