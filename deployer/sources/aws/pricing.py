"""EC2 prices from AWS's own APIs: the spot price history (EC2's DescribeSpotPriceHistory) for
spot instances, the price list (the Pricing API's GetProducts) for on-demand ones.

Both answers are untrusted input: their size is bounded, every price is a finite, non-negative
decimal, and each entry must be for the type, zone or region, and platform asked about (a
stand-in may ignore a filter; a product whose attributes differ is never taken). What cannot
be priced raises PriceUnknown with why, in words; nothing here estimates.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from deployer.core import boundedjson

# Linux/UNIX is all tfdeploy prices; EC2 reports spot prices under both names.
SPOT_PRODUCTS = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")
SPOT_PAGES = 20  # pages of spot price history read at most (1000 entries each)
PRICE_PAGES = 5  # pages of GetProducts (100 products each): one product is expected
PRICE_ITEM_BYTES = 512 * 1024  # one product of the price list (~10-30 kB with its terms)
MAX_RATE = Decimal(100_000)  # USD per hour: above any instance's price, so a wrong field shows
# The products of one instance type on-demand, as the Pricing API names their attributes.
ON_DEMAND_ATTRIBUTES = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
}
PRICING_REGION = "us-east-1"  # where the Pricing API answers for every region's prices


class PriceUnknown(Exception):
    """No price could be had; the message says why, for "cost unknown: <why>"."""


@dataclass(frozen=True)
class Rate:
    """An on-demand price: USD per hour, and the price list's publication date ('' if none)."""

    usd_per_hour: Decimal
    published: str


# ---- spot: the price history, integrated -----------------------------------------------------


def spot_history(
    client: Any, kind: str, zone: str, start: datetime, end: datetime
) -> list[tuple[float, Decimal]]:
    """The spot prices of `kind` in `zone` over [start, end], as (time, USD per hour), oldest
    first; EC2 includes the last change before `start`, the price in force at it."""
    entries: list[dict[str, Any]] = []
    pages = client.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=[kind],
        ProductDescriptions=list(SPOT_PRODUCTS),
        AvailabilityZone=zone,
        StartTime=start,
        EndTime=end,
    )
    for n, page in enumerate(pages):
        if n >= SPOT_PAGES:
            raise PriceUnknown(f"the spot price history of {kind} in {zone} is over {n} pages")
        entries += _list(page.get("SpotPriceHistory"))
    return spot_prices(entries, kind, zone)


def spot_prices(entries: Iterable[object], kind: str, zone: str) -> list[tuple[float, Decimal]]:
    """The history's entries for `kind` in `zone` (one product name: Linux/UNIX where EC2 gives
    it, else the VPC one), checked, oldest first."""
    by_product: dict[str, list[tuple[float, Decimal]]] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            raise PriceUnknown("the spot price history holds an entry that is no object")
        if entry.get("InstanceType") != kind or entry.get("AvailabilityZone") != zone:
            continue  # a stand-in may answer for every zone
        product = entry.get("ProductDescription")
        when = entry.get("Timestamp")
        if product not in SPOT_PRODUCTS or not isinstance(when, datetime):
            continue
        by_product.setdefault(str(product), []).append(
            (when.timestamp(), decimal_price(entry.get("SpotPrice"), f"spot price of {kind}"))
        )
    found = next((by_product[p] for p in SPOT_PRODUCTS if p in by_product), [])
    return sorted(found, key=lambda e: e[0])


def integrate(history: Sequence[tuple[float, Decimal]], start: float, end: float) -> Decimal:
    """USD for [start, end] at the prices of `history` (time, USD per hour; oldest first): each
    price from its time until the next one's. The price in force at `start` is the newest entry
    at or before it; with none, the interval cannot be priced."""
    if end <= start:
        return Decimal(0)
    before = [e for e in history if e[0] <= start]
    if not before:
        raise PriceUnknown("the spot price history has no price in force at the start")
    steps = [(start, before[-1][1]), *((t, p) for t, p in history if start < t < end), (end, None)]
    total = Decimal(0)
    for (t0, price), (t1, _) in itertools.pairwise(steps):
        assert price is not None
        total += price * Decimal(repr(t1 - t0)) / 3600
    return total


# ---- on-demand: the price list ---------------------------------------------------------------


def on_demand_rate(client: Any, kind: str, region: str) -> Rate:
    """The on-demand Linux price of `kind` in `region` from the Pricing API (GetProducts)."""
    filters = [
        {"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in ON_DEMAND_ATTRIBUTES.items()
    ]
    filters += [
        {"Type": "TERM_MATCH", "Field": "instanceType", "Value": kind},
        {"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
    ]
    items: list[object] = []
    token = None
    for _ in range(PRICE_PAGES):
        more: dict[str, str] = {"NextToken": token} if token else {}
        page = client.get_products(
            ServiceCode="AmazonEC2", Filters=filters, FormatVersion="aws_v1", MaxResults=100, **more
        )
        items += _list(page.get("PriceList"))
        token = page.get("NextToken")
        if not token:
            return parse_price_list(items, kind, region)
    raise PriceUnknown(f"the price list of {kind} in {region} is over {PRICE_PAGES} pages")


def parse_price_list(items: Sequence[object], kind: str, region: str) -> Rate:
    """The hourly USD price of `kind` in `region` from GetProducts' PriceList (each item a JSON
    text of one product and its terms). Products whose attributes are not the ones asked for
    are left out; the rest must agree on one on-demand hourly price."""
    rates: set[Decimal] = set()
    published = ""
    for item in items:
        product = _product(item)
        if not _matches(product.get("product"), kind, region):
            continue
        for rate in _hourly_rates(product.get("terms"), kind):
            rates.add(rate)
        published = max(published, _text(product.get("publicationDate")))
    if not rates:
        raise PriceUnknown(
            f"the AWS price list has no on-demand Linux price for {kind} in {region}"
        )
    if len(rates) > 1:
        listed = ", ".join(f"${r}" for r in sorted(rates))
        raise PriceUnknown(f"the AWS price list gives {kind} in {region} several prices: {listed}")
    return Rate(rates.pop(), published)


def _product(item: object) -> dict[str, Any]:
    if not isinstance(item, str) or len(item) > PRICE_ITEM_BYTES:
        raise PriceUnknown("the AWS price list sent a product that is no text or is too long")
    try:
        product = boundedjson.loads(item, limit=16)
    except ValueError as exc:
        raise PriceUnknown(f"the AWS price list sent a product that is no JSON ({exc})") from None
    if not isinstance(product, dict):
        raise PriceUnknown("the AWS price list sent a product that is no object")
    return product


def _matches(product: object, kind: str, region: str) -> bool:
    if not isinstance(product, dict) or not isinstance(product.get("attributes"), dict):
        return False
    found = product["attributes"]
    wanted = {**ON_DEMAND_ATTRIBUTES, "instanceType": kind, "regionCode": region}
    return all(found.get(k) == v for k, v in wanted.items())


def _hourly_rates(terms: object, kind: str) -> list[Decimal]:
    """Every hourly USD price of the product's on-demand terms."""
    on_demand = terms.get("OnDemand") if isinstance(terms, dict) else None
    rates = []
    for term in on_demand.values() if isinstance(on_demand, dict) else ():
        dimensions = term.get("priceDimensions") if isinstance(term, dict) else None
        for dim in dimensions.values() if isinstance(dimensions, dict) else ():
            if not isinstance(dim, dict) or dim.get("unit") not in ("Hrs", "Hours"):
                continue
            per_unit = dim.get("pricePerUnit")
            if isinstance(per_unit, dict) and "USD" in per_unit:
                rates.append(decimal_price(per_unit["USD"], f"on-demand price of {kind}"))
    return rates


# ---- checking numbers --------------------------------------------------------------------------


def decimal_price(value: object, what: str) -> Decimal:
    """A price as AWS writes it ("1.0060000000"): a finite, non-negative decimal, in bounds."""
    if not isinstance(value, str) or len(value) > 40:
        raise PriceUnknown(f"the {what} is not a price: {_shown(value)}")
    try:
        price = Decimal(value)
    except InvalidOperation:
        raise PriceUnknown(f"the {what} is not a number: {_shown(value)}") from None
    if not price.is_finite():
        raise PriceUnknown(f"the {what} is not a finite number: {_shown(value)}")
    if price < 0 or price > MAX_RATE:
        raise PriceUnknown(f"the {what} is out of bounds: {_shown(value)}")
    return price


def _shown(value: object) -> str:
    return json.dumps(value)[:40] if isinstance(value, str | int | float) else type(value).__name__


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: object) -> str:
    return value[:40] if isinstance(value, str) else ""
