"""Deterministic synthetic financial-news corpus for the demo model pair.

The demo ships a small target/draft pair trained from scratch, so the text
they learn has to be generated locally and reproducibly (no downloads).  The
generator below mixes two ingredients on purpose:

* recurring structure -- a fixed universe of fictional companies (name, ticker
  and sector always travel together), a header per document type and a
  limited set of sentence templates, so a small LM can learn the corpus well
  and a one-layer draft can agree with the target most of the time;
* real randomness -- figures, dates, directions, analysts and template choices
  are drawn per document, so sampling from the models is not a lookup.

All companies, banks and people are fictional.  Figures are internally
consistent where it matters for learnability (e.g. "beat" only appears when
the reported EPS is above the estimate), but carry no real-world meaning.

Everything is pure Python and driven by a single ``random.Random(seed)``, so
the same ``(num_documents, seed)`` always yields the same documents.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from pathlib import Path

# ---------------------------------------------------------------------------
# Fixed universe.  Keeping these lists fixed (rather than generating names) is
# what lets the models memorise the name <-> ticker <-> sector associations.
# ---------------------------------------------------------------------------

# (name, ticker, sector)
COMPANIES: list[tuple[str, str, str]] = [
    ("Northwind Logistics", "NWL", "industrials"),
    ("Bluepeak Semiconductor", "BPS", "technology"),
    ("Harborview Bancorp", "HVB", "financials"),
    ("Cedar Ridge Energy", "CRE", "energy"),
    ("Solace Therapeutics", "SLTX", "health care"),
    ("Granite Peak Mining", "GPM", "materials"),
    ("Lumen Grove Software", "LGS", "technology"),
    ("Atlas Freight Lines", "AFL", "industrials"),
    ("Meridian Retail Group", "MRG", "consumer"),
    ("Ironclad Insurance", "ICI", "financials"),
    ("Vantage Cloud Systems", "VCS", "technology"),
    ("Silverline Airways", "SLA", "industrials"),
    ("Crestwood Pharmaceuticals", "CWP", "health care"),
    ("Redfern Utilities", "RFU", "utilities"),
    ("Oakmont Homebuilders", "OMH", "real estate"),
    ("Pinnacle Foods", "PNF", "consumer"),
    ("Quantum Forge Robotics", "QFR", "technology"),
    ("Sterling Capital Partners", "SCP", "financials"),
    ("Tidewater Shipping", "TWS", "industrials"),
    ("Evergreen Renewables", "EVR", "utilities"),
    ("Falcon Ridge Oil", "FRO", "energy"),
    ("Monarch Apparel", "MNA", "consumer"),
    ("Beacon Health Networks", "BHN", "health care"),
    ("Summit Data Centers", "SDC", "real estate"),
    ("Kestrel Aerospace", "KSA", "industrials"),
    ("Coral Bay Resorts", "CBR", "consumer"),
    ("Orion Payments", "ORP", "financials"),
    ("Halcyon Biotech", "HBIO", "health care"),
    ("Westgate Steel", "WGS", "materials"),
    ("Nimbus Networks", "NMBS", "technology"),
    ("Riverside Telecom", "RVT", "communication"),
    ("Brightwave Media", "BWM", "communication"),
]

BANKS = [
    "Calloway Securities",
    "Hartwell & Co",
    "Ridgeline Capital",
    "Marston Brothers",
    "Ellery Research",
    "Dunmore Partners",
    "Ashford Global Markets",
    "Penrose Advisory",
]

ANALYST_FIRST = [
    "Maria",
    "James",
    "Priya",
    "Daniel",
    "Sofia",
    "Kenji",
    "Laura",
    "Omar",
    "Elena",
    "David",
]
ANALYST_LAST = [
    "Chen",
    "Okafor",
    "Larsen",
    "Moreau",
    "Patel",
    "Novak",
    "Ramirez",
    "Fischer",
    "Tanaka",
    "Walsh",
]

EXEC_TITLES = [
    "Chief Executive",
    "Chief Financial Officer",
    "Chief Executive Officer",
    "finance chief",
]

RATINGS = [
    "buy",
    "overweight",
    "outperform",
    "neutral",
    "equal weight",
    "hold",
    "underweight",
    "sell",
]
# Index into RATINGS that separates bullish ratings (lower) from bearish ones.
_BULLISH_CUTOFF = 3

INDICES = [
    # (name, typical level) -- levels only seed a plausible number range.
    ("the Meridian 500", 5200.0),
    ("the Tech 100", 18000.0),
    ("the Industrial 30", 39000.0),
    ("the Small Cap 2000", 2050.0),
]

WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
QUARTERS = ["first-quarter", "second-quarter", "third-quarter", "fourth-quarter"]
QUARTER_SHORT = ["Q1", "Q2", "Q3", "Q4"]
YEARS = [2021, 2022, 2023, 2024, 2025]

MARKET_DRIVERS = [
    "investors digested a fresh batch of corporate earnings",
    "traders weighed comments from central bank officials",
    "a hotter-than-expected inflation report pushed yields higher",
    "softer jobs data revived hopes of lower interest rates",
    "oil prices swung sharply on supply concerns",
    "investors rotated out of technology and into defensive sectors",
    "bond yields eased after a strong Treasury auction",
    "trading volumes stayed light ahead of a holiday weekend",
    "a rally in chip stocks lifted the broader market",
    "worries about consumer spending weighed on retailers",
]

# Reasons are split by tone so that a raised outlook or an upgrade is never
# explained by bad news: coherent text is easier to learn than random pairs.
GUIDANCE_REASONS_UP = [
    "strong demand from enterprise customers",
    "favorable currency movements",
    "continued pricing power",
    "solid order backlogs",
    "growth in subscription revenue",
]
GUIDANCE_REASONS_DOWN = [
    "higher input costs",
    "a weaker consumer backdrop",
    "supply chain disruptions",
    "slower spending by corporate clients",
    "lower freight volumes",
]

ANALYST_REASONS_UP = [
    "citing improving margins",
    "pointing to accelerating revenue growth",
    "citing a stronger balance sheet",
    "citing a clearer path to profitability",
    "after meetings with management",
]
ANALYST_REASONS_DOWN = [
    "citing a stretched valuation",
    "pointing to rising competition",
    "citing slowing demand",
    "citing pressure on margins",
    "after meetings with management",
]

COMMODITIES = [
    # (name, unit, typical price)
    ("Brent crude", "a barrel", 82.0),
    ("West Texas Intermediate crude", "a barrel", 78.0),
    ("Gold", "an ounce", 2050.0),
    ("Copper", "a pound", 3.9),
    ("Natural gas", "per million British thermal units", 2.6),
    ("Silver", "an ounce", 24.0),
]

CURRENCY_PAIRS = [
    # (pair, typical rate)
    ("the euro", 1.08),
    ("the British pound", 1.26),
    ("the Japanese yen", 148.0),
    ("the Swiss franc", 0.88),
    ("the Canadian dollar", 1.35),
]


# ---------------------------------------------------------------------------
# Number formatting helpers.  Numbers are always written in the same few
# styles so the format is learnable while the digits stay random.
# ---------------------------------------------------------------------------


def _money(value: float) -> str:
    """Dollar amount with two decimals, e.g. ``$4.27``."""
    return f"${value:,.2f}"


def _billions(value: float) -> str:
    """Dollar amount in billions, e.g. ``$4.27 billion`` or ``$812 million``."""
    if value < 1.0:
        return f"${value * 1000:.0f} million"
    return f"${value:,.2f} billion"


def _pct(value: float) -> str:
    return f"{value:.1f}%"


def _level(value: float) -> str:
    return f"{value:,.2f}"


class _Doc:
    """Per-document random helpers bound to one ``random.Random``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def pick(self, options):
        return self.rng.choice(options)

    def company(self) -> tuple[str, str, str]:
        return self.rng.choice(COMPANIES)

    def two_companies(self) -> tuple[tuple[str, str, str], tuple[str, str, str]]:
        a, b = self.rng.sample(COMPANIES, 2)
        return a, b

    def analyst(self) -> str:
        return f"{self.pick(ANALYST_FIRST)} {self.pick(ANALYST_LAST)}"

    def period(self) -> tuple[str, str, int]:
        q = self.rng.randrange(4)
        return QUARTERS[q], QUARTER_SHORT[q], self.pick(YEARS)

    def uniform(self, lo: float, hi: float) -> float:
        return self.rng.uniform(lo, hi)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p


# ---------------------------------------------------------------------------
# Document templates.  Each returns one document: "Header: sentence sentence..."
# ---------------------------------------------------------------------------


def _earnings(d: _Doc) -> str:
    name, ticker, sector = d.company()
    quarter, qshort, year = d.period()
    revenue = d.uniform(0.4, 25.0)
    growth = d.uniform(-12.0, 28.0)
    rev_est = revenue * d.uniform(0.93, 1.07)
    eps = d.uniform(0.05, 4.5)
    eps_est = max(0.01, eps + d.uniform(-0.35, 0.35))
    beat = eps >= eps_est

    change = f"up {_pct(growth)}" if growth >= 0 else f"down {_pct(-growth)}"
    opening = d.pick(
        [
            (
                f"{name} ({ticker}) reported {quarter} revenue of {_billions(revenue)}, "
                f"{change} from a year earlier, compared with analyst estimates of {_billions(rev_est)}."
            ),
            (f"{name} ({ticker}) said {quarter} {year} revenue came in at {_billions(revenue)}, {change} year over year."),
            (f"{name} ({ticker}) posted {qshort} {year} sales of {_billions(revenue)}, {change} from the same period last year."),
        ]
    )
    verb = d.pick(["beating", "topping", "ahead of"]) if beat else d.pick(["missing", "below", "short of"])
    eps_sentence = d.pick(
        [
            f"Adjusted earnings per share were {_money(eps)}, {verb} the consensus estimate of {_money(eps_est)}.",
            f"Earnings per share came in at {_money(eps)}, {verb} the {_money(eps_est)} analysts had expected.",
            f"The company earned {_money(eps)} a share on an adjusted basis, {verb} forecasts of {_money(eps_est)}.",
        ]
    )
    sentences = [opening, eps_sentence]

    if d.chance(0.7):
        raised = d.chance(0.5 if beat else 0.3)
        lo = d.uniform(1.0, 90.0)
        hi = lo * d.uniform(1.02, 1.08)
        action = "raised" if raised else d.pick(["cut", "lowered", "reaffirmed"])
        reasons = GUIDANCE_REASONS_DOWN if action in ("cut", "lowered") else GUIDANCE_REASONS_UP
        sentences.append(
            d.pick(
                [
                    (
                        f"The company {action} its full-year revenue outlook {'of' if action == 'reaffirmed' else 'to'} {_billions(lo)} to {_billions(hi)}, "
                        f"citing {d.pick(reasons)}."
                    ),
                    f"Management {action} full-year guidance, pointing to {d.pick(reasons)}.",
                ]
            )
        )
    if d.chance(0.5):
        title = d.pick(EXEC_TITLES)
        tone = "confident" if beat else "cautious"
        sentences.append(
            d.pick(
                [
                    f'"We remain {tone} about the rest of the year," the {title} said on a call with analysts.',
                    f"The {title} told analysts the company was {tone} about demand in the {sector} sector.",
                ]
            )
        )
    move = d.uniform(0.3, 14.0)
    up = beat if d.chance(0.8) else not beat
    direction = d.pick(["rose", "climbed", "gained"]) if up else d.pick(["fell", "slipped", "dropped"])
    sentences.append(
        d.pick(
            [
                f"Shares {direction} {_pct(move)} in extended trading.",
                f"The stock {direction} {_pct(move)} in early trading.",
                f"{ticker} shares {direction} {_pct(move)} after the report.",
            ]
        )
    )
    return "Quarterly results: " + " ".join(sentences)


def _market_wrap(d: _Doc) -> str:
    day = d.pick(WEEKDAYS)
    overall_up = d.chance(0.55)
    sentences = [
        f"Stocks {'rose' if overall_up else 'fell'} on {day} as {d.pick(MARKET_DRIVERS)}."
        if d.chance(0.6)
        else f"Wall Street {'closed higher' if overall_up else 'ended lower'} on {day} as {d.pick(MARKET_DRIVERS)}."
    ]
    parts = []
    for index_name, base in d.rng.sample(INDICES, d.rng.randint(2, 3)):
        # Mostly move with the market, occasionally against it.
        up = overall_up if d.chance(0.85) else not overall_up
        pct = d.uniform(0.05, 2.4)
        level = base * d.uniform(0.85, 1.15)
        verb = d.pick(["gained", "added", "rose"]) if up else d.pick(["lost", "fell", "declined"])
        parts.append(f"{index_name} {verb} {_pct(pct)} to {_level(level)}")
    indices = ", ".join(parts[:-1]) + f", while {parts[-1]}."
    sentences.append(indices[0].upper() + indices[1:])

    # The named mover belongs to the sector that led, as in real wraps.
    leader = d.company()
    sector = leader[2]
    lead_verb = "led gains" if overall_up else "led losses"
    sentences.append(
        d.pick(
            [
                (
                    f"{sector.capitalize()} shares {lead_verb}, with {leader[0]} ({leader[1]}) "
                    f"{'up' if overall_up else 'down'} {_pct(d.uniform(1.0, 9.0))}."
                ),
                (
                    f"{leader[0]} ({leader[1]}) was among the biggest movers, "
                    f"{'rising' if overall_up else 'falling'} {_pct(d.uniform(1.0, 9.0))}."
                ),
            ]
        )
    )
    if d.chance(0.6):
        y10 = d.uniform(3.4, 4.9)
        bp = d.rng.randint(1, 12)
        sentences.append(f"The 10-year Treasury yield {'rose' if d.chance(0.5) else 'fell'} {bp} basis points to {y10:.2f}%.")
    if d.chance(0.4):
        commodity, unit, base = d.pick(COMMODITIES[:3])
        sentences.append(f"{commodity} settled at {_money(base * d.uniform(0.85, 1.15))} {unit}.")
    return "Market wrap: " + " ".join(sentences)


def _rates(d: _Doc) -> str:
    month = d.pick(MONTHS)
    action = d.pick(["held", "raised", "cut"])
    lo = d.rng.randint(0, 22) * 0.25
    rng_text = f"{lo:.2f}% to {lo + 0.25:.2f}%"
    if action == "held":
        decision = d.pick(
            [
                f"The Federal Reserve held its benchmark rate steady in a range of {rng_text} at its {month} meeting.",
                f"Fed policymakers left interest rates unchanged at {rng_text} in {month}.",
            ]
        )
    else:
        decision = d.pick(
            [
                (f"The Federal Reserve {action} its benchmark rate by 25 basis points to a range of {rng_text} at its {month} meeting."),
                f"Fed policymakers {action} interest rates by a quarter point to {rng_text} in {month}.",
            ]
        )
    cuts = d.rng.randint(0, 4)
    bank = d.pick(BANKS)
    sentences = [
        decision,
        d.pick(
            [
                f"Futures markets now price in {cuts} rate cut{'s' if cuts != 1 else ''} by the end of the year.",
                f"Traders now expect {cuts} more move{'s' if cuts != 1 else ''} over the next twelve months.",
            ]
        ),
    ]
    y2 = d.uniform(3.5, 5.2)
    sentences.append(
        d.pick(
            [
                f"The 2-year Treasury yield, which is sensitive to policy expectations, moved to {y2:.2f}%.",
                f"Two-year yields settled at {y2:.2f}% after the statement.",
            ]
        )
    )
    if d.chance(0.7):
        infl = d.uniform(1.8, 4.5)
        sentences.append(
            d.pick(
                [
                    (
                        f"Economists at {bank} said core inflation near {_pct(infl)} leaves little room for "
                        f"{'further easing' if action == 'cut' else 'a quick pivot'}."
                    ),
                    (
                        f'"The path for rates depends on inflation, which is still running at {_pct(infl)}," '
                        f"said {d.analyst()}, an economist at {bank}."
                    ),
                ]
            )
        )
    return "Rates outlook: " + " ".join(sentences)


def _analyst_note(d: _Doc) -> str:
    name, ticker, _sector = d.company()
    bank = d.pick(BANKS)
    upgrade = d.chance(0.5)
    # Upgrades move towards bullish ratings, downgrades away from them.
    if upgrade:
        new = d.rng.randrange(0, _BULLISH_CUTOFF + 1)
        old = d.rng.randrange(new + 1, len(RATINGS))
    else:
        new = d.rng.randrange(_BULLISH_CUTOFF, len(RATINGS))
        old = d.rng.randrange(0, new)
    old_pt = d.uniform(12.0, 480.0)
    new_pt = old_pt * (d.uniform(1.05, 1.35) if upgrade else d.uniform(0.7, 0.95))
    verb = "upgraded" if upgrade else "downgraded"
    pt_verb = d.pick(["raising", "lifting"]) if upgrade else d.pick(["cutting", "lowering"])
    sentences = [
        (
            f"{bank} {verb} {name} ({ticker}) to {RATINGS[new]} from {RATINGS[old]}, "
            f"{pt_verb} its price target to {_money(new_pt)} from {_money(old_pt)}, {d.pick(ANALYST_REASONS_UP if upgrade else ANALYST_REASONS_DOWN)}."
        )
    ]
    if d.chance(0.6):
        sentences.append(
            f"Analyst {d.analyst()} wrote that the company "
            + (
                d.pick(
                    [
                        "is well placed to gain share",
                        "has room to expand margins",
                        "is underappreciated",
                    ]
                )
                if upgrade
                else d.pick(
                    [
                        "faces a tougher year",
                        "looks fully valued",
                        "may struggle to hit targets",
                    ]
                )
            )
            + "."
        )
    move = d.uniform(0.4, 7.5)
    sentences.append(f"Shares {'rose' if upgrade else 'fell'} {_pct(move)} in {d.pick(['premarket', 'morning', 'afternoon'])} trading.")
    return "Analyst note: " + " ".join(sentences)


def _deal(d: _Doc) -> str:
    (buyer, bt, _), (target, tt, sector) = d.two_companies()
    value = d.uniform(0.3, 40.0)
    price = d.uniform(8.0, 220.0)
    premium = d.uniform(8.0, 55.0)
    kind = d.pick(["an all-cash", "a cash-and-stock", "an all-stock"])
    sentences = [
        d.pick(
            [
                (
                    f"{buyer} ({bt}) agreed to acquire {target} ({tt}) in {kind} deal valued at about "
                    f"{_billions(value)}, or {_money(price)} per share."
                ),
                (
                    f"{buyer} ({bt}) will buy {target} ({tt}) for {_money(price)} a share in {kind} transaction "
                    f"worth roughly {_billions(value)}."
                ),
            ]
        ),
        f"The offer represents a premium of {_pct(premium)} to {target}'s last closing price.",
    ]
    if d.chance(0.6):
        sentences.append(
            f"The deal is expected to close in the {d.pick(['first half of', 'second half of', 'first quarter of'])} "
            f"{d.pick(YEARS)}, subject to regulatory approval."
        )
    if d.chance(0.5):
        sentences.append(f"The combination would create one of the larger players in the {sector} sector.")
    sentences.append(f"{tt} shares jumped {_pct(premium * d.uniform(0.6, 0.95))}.")
    return "Deal news: " + " ".join(sentences)


def _corporate(d: _Doc) -> str:
    name, ticker, _ = d.company()
    sentences = []
    if d.chance(0.5):
        div = d.uniform(0.05, 2.5)
        raise_pct = d.uniform(2.0, 15.0)
        sentences.append(f"{name} ({ticker}) raised its quarterly dividend by {_pct(raise_pct)} to {_money(div)} per share.")
        sentences.append(f"The dividend is payable on {d.pick(MONTHS)} {d.rng.randint(1, 28)}.")
    else:
        size = d.uniform(0.2, 15.0)
        sentences.append(f"{name} ({ticker}) announced a new share buyback program of up to {_billions(size)}.")
        sentences.append(
            d.pick(
                [
                    "The program replaces an earlier authorization and has no fixed expiration date.",
                    f"The company said it would fund repurchases from free cash flow of about {_billions(size * 1.4)}.",
                ]
            )
        )
    if d.chance(0.4):
        sentences.append(f"Shares were up {_pct(d.uniform(0.2, 4.0))} at midday.")
    return "Corporate update: " + " ".join(sentences)


def _commodities(d: _Doc) -> str:
    sentences = []
    for commodity, unit, base in d.rng.sample(COMMODITIES, d.rng.randint(2, 3)):
        up = d.chance(0.5)
        verb = d.pick(["rose", "climbed", "advanced"]) if up else d.pick(["fell", "slipped", "eased"])
        sentences.append(f"{commodity} {verb} {_pct(d.uniform(0.1, 3.5))} to {_money(base * d.uniform(0.8, 1.2))} {unit}.")
    pair, base = d.pick(CURRENCY_PAIRS)
    strong = d.chance(0.5)
    sentences.append(
        f"In currency markets, the dollar {'strengthened' if strong else 'weakened'} against {pair}, "
        f"trading at {base * d.uniform(0.95, 1.05):.4f}."
    )
    if d.chance(0.5):
        sentences.append(
            f"Strategists at {d.pick(BANKS)} said {d.pick(['demand from Asia', 'inventory data', 'the dollar'])} "
            f"would remain the main driver in the coming weeks."
        )
    return "Commodities: " + " ".join(sentences)


_TEMPLATES: list[tuple[Callable[[_Doc], str], float]] = [
    (_earnings, 0.30),
    (_market_wrap, 0.18),
    (_analyst_note, 0.15),
    (_rates, 0.10),
    (_deal, 0.10),
    (_corporate, 0.09),
    (_commodities, 0.08),
]

#: Prompt prefixes for the demo, one per document header.  They deliberately
#: end *without* a trailing space: the byte-level tokenizer attaches the space
#: to the following word, so a dangling space would be a token the models
#: rarely saw in training.
DEMO_PROMPTS: list[str] = [
    "Quarterly results:",
    "Market wrap:",
    "Analyst note:",
    "Rates outlook:",
    "Deal news:",
    "Commodities:",
    "Quarterly results: Bluepeak Semiconductor (BPS)",
]


def generate_corpus(num_documents: int, seed: int = 0) -> list[str]:
    """Return ``num_documents`` synthetic financial-news documents.

    Deterministic for a given ``(num_documents, seed)``; a longer corpus with
    the same seed extends a shorter one (document ``i`` does not depend on
    ``num_documents``).
    """
    if num_documents < 0:
        raise ValueError("num_documents must be non-negative")
    rng = random.Random(seed)
    funcs = [f for f, _ in _TEMPLATES]
    weights = [w for _, w in _TEMPLATES]
    docs = []
    for _ in range(num_documents):
        func = rng.choices(funcs, weights=weights, k=1)[0]
        docs.append(func(_Doc(rng)))
    return docs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write the synthetic financial corpus, one document per line.")
    parser.add_argument("--out", type=Path, required=True, help="output text file")
    parser.add_argument("--num-documents", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    docs = generate_corpus(args.num_documents, seed=args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(docs) + "\n", encoding="utf-8")
    print(f"wrote {len(docs)} documents to {args.out}")


if __name__ == "__main__":
    main()
