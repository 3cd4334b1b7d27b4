"""A vectorized Nexmark generator: Person / Auction / Bid events as Polars frames.

It follows the data model of the reference generator in
https://github.com/nexmark/nexmark (``nexmark-flink/.../generator/``, read at
commit 6b3646c, 2025-12-26; itself a port of Apache Beam's
``sdks/java/testing/nexmark`` generator): the same proportions (1 person, 3
auctions, 46 bids in every 50 events, by event number), the same id rules
(ids start at 1000; an auction's seller and a bid's bidder are a "hot" person
with probability 3/4 or else one of the last 1,000 people plus a lead of 10
not yet generated; a bid's auction is hot with probability 1/2 or else one of
the last 100 auctions plus a lead of 10), the same prices
(``round(10 ** U(0, 6) * 100)``), categories (10..14), auction lengths (up to
twice the time until 100 more auctions), string lengths and average event
sizes (person 200, auction 500, bid 100 bytes), and the same event time:
event ``n`` happens at ``base_time + floor(n * 1e6 / rate) // 1000`` ms, in
order (the reference's ``outOfOrderGroupSize`` is 1 by default).

What differs, on purpose:

- the random draws: numpy's PCG64 from ``seed`` and the file index, not
  Java's ``SplittableRandom`` stream, so the values follow the same
  distributions but are not the reference's values;
- strings are slices of one random lowercase string (as the reference's
  ``extra``), without the reference's occasional spaces inside names;
- **the bidder-id quirk**: nexmark/nexmark's ``BidGenerator.nextBid`` adds
  ``FIRST_PERSON_ID`` to the bidder twice (ids from 2000, so a bidder is not
  the person of the same id; Beam adds it once). We add it once by default, so
  bidders are people as the model intends; ``bidder_id_quirk=True`` reproduces
  the double offset. The hot bidder (the second person of the last block of
  100) may not exist yet when that block has just started: kept, as in both
  references. None of q0-q12 joins bidders to people, so neither choice
  changes their cost.

Everything is computed with numpy/Polars over whole arrays: no Python loop per
event.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
PERSON_ID_LEAD = 10
AUCTION_ID_LEAD = 10
HOT_SELLER_RATIO = 100
HOT_AUCTION_RATIO = 100
HOT_BIDDER_RATIO = 100
CHANNELS = 10_000
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend",
             "Redmond", "Seattle", "Kent", "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah",
               "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones",
              "Noris")
TIME = pl.Datetime("ms", "UTC")
PERSON = "person"
AUCTION = "auction"
BID = "bid"
STREAMS = (PERSON, AUCTION, BID)


@dataclass(frozen=True)
class NexmarkConfig:
    """The generator's parameters; defaults are the reference's (``NexmarkConfiguration``).

    ``rate`` is events per second of *event time*: the reference suite's 10M/s
    (nexmark/nexmark's ``nexmark.yaml``: 100M events at 10M/s, 10 s of event
    time). A run of a few million events then spans well under one 10-second
    window, so the windowed queries emit at the end of input (the benchmark
    starts them with ``flush_at_end=True``, as Flink emits every window at the
    end of bounded input); a lower rate (``--rate``) makes windows close during
    the run.
    """

    rate: int = 10_000_000
    seed: int = 1
    base_time_ms: int = 1_767_225_600_000
    """2026-01-01T00:00:00Z."""
    person_proportion: int = 1
    auction_proportion: int = 3
    bid_proportion: int = 46
    num_active_people: int = 1000
    num_in_flight_auctions: int = 100
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4
    avg_person_bytes: int = 200
    avg_auction_bytes: int = 500
    avg_bid_bytes: int = 100
    bidder_id_quirk: bool = False

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError(f"NexmarkConfig.rate must be positive events/s, got {self.rate}")

    @property
    def total_proportion(self) -> int:
        return self.person_proportion + self.auction_proportion + self.bid_proportion

    def timestamp_ms(self, n: np.ndarray) -> np.ndarray:
        """Event time (epoch ms) of event numbers ``n``, as the reference computes it."""
        delay_us = 1_000_000.0 / self.rate
        return self.base_time_ms + (n * delay_us).astype(np.int64) // 1000

    def events_ms(self, events: int) -> float:
        """Event-time milliseconds spanned by ``events`` consecutive events (rounded up)."""
        return math.ceil(events * 1000 / self.rate) + 1

    def person_reach_ms(self) -> tuple[float, float]:
        """How far back and ahead (ms of event time) of an auction its seller's
        person event can be: the oldest active person (``num_active_people`` people,
        one per ``total_proportion`` events) and the lead of ``PERSON_ID_LEAD`` people
        not yet generated. Q3's interval join uses these bounds."""
        back = (self.num_active_people + 1) * self.total_proportion
        ahead = (PERSON_ID_LEAD + 1) * self.total_proportion
        return self.events_ms(back), self.events_ms(ahead)

    def auction_length_max_ms(self) -> float:
        """The longest auction (``expires - dateTime``) the generator can draw."""
        ahead = self.num_in_flight_auctions * self.total_proportion // self.auction_proportion
        return 2 * self.events_ms(ahead) + 1


# --------------------------------------------------------------------------- ids


def last_person(cfg: NexmarkConfig, e: np.ndarray) -> np.ndarray:
    """Base-0 id of the last person generated at or before event id ``e``."""
    epoch, off = np.divmod(e, cfg.total_proportion)
    return epoch * cfg.person_proportion + np.minimum(off, cfg.person_proportion - 1)


def last_auction(cfg: NexmarkConfig, e: np.ndarray) -> np.ndarray:
    """Base-0 id of the last auction generated at or before event id ``e``."""
    epoch, off = np.divmod(e, cfg.total_proportion)
    p, a = cfg.person_proportion, cfg.auction_proportion
    is_person = off < p
    epoch = np.where(is_person, epoch - 1, epoch)
    off = np.where(is_person | (off >= p + a), a - 1, off - p)
    return np.asarray(epoch * a + off, dtype=np.int64)


def next_person(cfg: NexmarkConfig, e: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random active person (or one of the next ``PERSON_ID_LEAD``), base 0."""
    num = last_person(cfg, e) + 1
    active = np.minimum(num, cfg.num_active_people)
    return np.asarray(num - active + rng.integers(0, active + PERSON_ID_LEAD), dtype=np.int64)


def next_auction(cfg: NexmarkConfig, e: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random auction likely still in flight (or one of the next ``AUCTION_ID_LEAD``)."""
    top = last_auction(cfg, e)
    low = np.maximum(top - cfg.num_in_flight_auctions, 0)
    return np.asarray(low + rng.integers(0, top - low + 1 + AUCTION_ID_LEAD), dtype=np.int64)


def next_price(rng: np.random.Generator, n: int) -> np.ndarray:
    """Prices in cents, log-uniform over 1..1,000,000 dollars."""
    return np.round(10.0 ** (rng.random(n) * 6.0) * 100.0).astype(np.int64)


# --------------------------------------------------------------------------- strings


class _Strings:
    """Random lowercase text and the vectorized slices the generator takes of it."""

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng([seed, 0x5EED])
        self.text = rng.integers(ord("a"), ord("z") + 1, size=1 << 20, dtype=np.uint8)

    def slices(self, rng: np.random.Generator, lengths: np.ndarray) -> pl.Series:
        """One random slice of the text per length, built as one Arrow string array."""
        lengths = lengths.astype(np.int64)
        starts = rng.integers(0, len(self.text) - int(lengths.max(initial=0)) - 1,
                              size=len(lengths))
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # byte j of the output is text[start_i + (j - offsets_i)] for the row i it falls in
        index = np.arange(offsets[-1], dtype=np.int64) + np.repeat(starts - offsets[:-1], lengths)
        data = self.text[index]
        array = pa.LargeStringArray.from_buffers(
            len(lengths), pa.py_buffer(offsets), pa.py_buffer(data.tobytes()))
        series = pl.Series(array)
        assert isinstance(series, pl.Series)
        return series

    def short(self, rng: np.random.Generator, n: int, max_length: int) -> pl.Series:
        """The reference's ``nextString(max_length)``: 3 to ``max_length - 1`` letters."""
        return self.slices(rng, 3 + rng.integers(0, max_length - 3, size=n))

    def extra(self, rng: np.random.Generator, n: int, current: np.ndarray | int,
              average: int) -> pl.Series:
        """Padding that brings an event to ``average`` bytes on average (±20 %)."""
        want = np.maximum(average - np.asarray(current), 0) + np.zeros(n, dtype=np.int64)
        delta = np.round(want * 0.2).astype(np.int64)
        jitter = (rng.random(n) * 2 * delta).astype(np.int64)
        return self.slices(rng, want - delta + jitter)


def _pick(values: tuple[str, ...], idx: np.ndarray) -> pl.Series:
    return pl.Series(values, dtype=pl.String).gather(pl.Series(idx))


def _bit_reverse32(i: np.ndarray) -> np.ndarray:
    """Java's ``Math.abs(Integer.reverse(i))`` for 0 <= i < 2**31."""
    bits = (i[:, None] >> np.arange(32)) & 1
    rev = (bits * (1 << np.arange(31, -1, -1, dtype=np.int64))).sum(axis=1)
    signed = np.where(rev >= 1 << 31, rev - (1 << 32), rev)
    return np.asarray(np.abs(signed), dtype=np.int64)


def _urls(strings: _Strings, rng: np.random.Generator, n: int) -> pl.Series:
    parts = [strings.short(rng, n, 5) for _ in range(3)]
    url = pl.concat_str(pl.lit("https://www.nexmark.com/"), pl.lit(parts[0]), pl.lit("/"),
                        pl.lit(parts[1]), pl.lit("/"), pl.lit(parts[2]),
                        pl.lit("/item.htm?query=1"))
    return pl.select(url.alias("url")).to_series()


class NexmarkGenerator:
    """Deterministic Nexmark events: ``events(lo, hi)`` gives every event whose number
    is in ``[lo, hi)`` as three frames (person, auction, bid), the same for the same
    ``config``, ``lo`` and ``hi``."""

    def __init__(self, config: NexmarkConfig | None = None) -> None:
        self.config = config or NexmarkConfig()
        self._strings = _Strings(self.config.seed)
        rng = np.random.default_rng([self.config.seed, 0xC4A7])
        hot_urls = _urls(self._strings, rng, len(HOT_CHANNELS))
        cache = _urls(self._strings, rng, CHANNELS)
        suffix = pl.Series(_bit_reverse32(np.arange(CHANNELS, dtype=np.int64))).cast(pl.String)
        with_id = rng.integers(0, 10, size=CHANNELS) > 0
        cache = pl.select(
            pl.when(pl.Series(with_id)).then(cache + "&channel_id=" + suffix).otherwise(cache)
        ).to_series()
        self._channel_url = (pl.concat([hot_urls, cache]), pl.concat([
            pl.Series(HOT_CHANNELS), "channel-" + pl.Series(np.arange(CHANNELS)).cast(pl.String)
        ]))

    def events(self, lo: int, hi: int) -> dict[str, pl.DataFrame]:
        """Persons, auctions and bids of event numbers ``[lo, hi)``, each in event order."""
        cfg = self.config
        n = np.arange(lo, hi, dtype=np.int64)
        rem = n % cfg.total_proportion
        p, a = cfg.person_proportion, cfg.auction_proportion
        rng = np.random.default_rng([cfg.seed, lo, hi])
        return {
            PERSON: self._persons(n[rem < p], rng),
            AUCTION: self._auctions(n[(rem >= p) & (rem < p + a)], rng),
            BID: self._bids(n[rem >= p + a], rng),
        }

    def _persons(self, e: np.ndarray, rng: np.random.Generator) -> pl.DataFrame:
        cfg, s, k = self.config, self._strings, len(e)
        name = (_pick(FIRST_NAMES, rng.integers(0, len(FIRST_NAMES), size=k)) + " "
                + _pick(LAST_NAMES, rng.integers(0, len(LAST_NAMES), size=k)))
        cards = [pl.Series(rng.integers(0, 10_000, size=k)).cast(pl.String).str.zfill(4)
                 for _ in range(4)]
        frame = pl.DataFrame({
            "id": last_person(cfg, e) + FIRST_PERSON_ID,
            "name": name,
            "creditCard": pl.select(pl.concat_str(cards, separator=" ")).to_series(),
            "city": _pick(US_CITIES, rng.integers(0, len(US_CITIES), size=k)),
            "state": _pick(US_STATES, rng.integers(0, len(US_STATES), size=k)),
            "dateTime": pl.Series(cfg.timestamp_ms(e)).cast(TIME),
        })
        frame = frame.with_columns(
            emailAddress=pl.concat_str(pl.lit(s.short(rng, k, 7)), pl.lit("@"),
                                       pl.lit(s.short(rng, k, 5)), pl.lit(".com")),
        )
        size = 8 + frame.select(
            pl.sum_horizontal(pl.col("name", "emailAddress", "creditCard", "city", "state")
                              .str.len_bytes())
        ).to_series().to_numpy()
        frame = frame.with_columns(extra=s.extra(rng, k, size, cfg.avg_person_bytes))
        return frame.select("id", "name", "emailAddress", "creditCard", "city", "state",
                            "dateTime", "extra")

    def _auctions(self, e: np.ndarray, rng: np.random.Generator) -> pl.DataFrame:
        cfg, s, k = self.config, self._strings, len(e)
        hot = rng.integers(0, cfg.hot_sellers_ratio, size=k) > 0
        seller = np.where(hot, last_person(cfg, e) // HOT_SELLER_RATIO * HOT_SELLER_RATIO,
                          next_person(cfg, e, rng)) + FIRST_PERSON_ID
        ts = cfg.timestamp_ms(e)
        ahead = cfg.num_in_flight_auctions * cfg.total_proportion // cfg.auction_proportion
        horizon = cfg.timestamp_ms(e + ahead) - ts
        expires = ts + 1 + rng.integers(0, np.maximum(horizon * 2, 1))
        initial = next_price(rng, k)
        frame = pl.DataFrame({
            "id": last_auction(cfg, e) + FIRST_AUCTION_ID,
            "initialBid": initial,
            "reserve": initial + next_price(rng, k),
            "dateTime": pl.Series(ts).cast(TIME),
            "expires": pl.Series(expires).cast(TIME),
            "seller": seller,
            "category": FIRST_CATEGORY_ID + rng.integers(0, NUM_CATEGORIES, size=k),
        }).with_columns(itemName=s.short(rng, k, 20), description=s.short(rng, k, 100))
        size = 48 + frame.select(
            pl.col("itemName").str.len_bytes() + pl.col("description").str.len_bytes()
        ).to_series().to_numpy()
        frame = frame.with_columns(extra=s.extra(rng, k, size, cfg.avg_auction_bytes))
        return frame.select("id", "itemName", "description", "initialBid", "reserve",
                            "dateTime", "expires", "seller", "category", "extra")

    def _bids(self, e: np.ndarray, rng: np.random.Generator) -> pl.DataFrame:
        cfg, s, k = self.config, self._strings, len(e)
        hot_auction = rng.integers(0, cfg.hot_auction_ratio, size=k) > 0
        auction = np.where(hot_auction,
                           last_auction(cfg, e) // HOT_AUCTION_RATIO * HOT_AUCTION_RATIO,
                           next_auction(cfg, e, rng)) + FIRST_AUCTION_ID
        hot_bidder = rng.integers(0, cfg.hot_bidders_ratio, size=k) > 0
        bidder = np.where(hot_bidder,
                          last_person(cfg, e) // HOT_BIDDER_RATIO * HOT_BIDDER_RATIO + 1,
                          next_person(cfg, e, rng)) + FIRST_PERSON_ID
        if cfg.bidder_id_quirk:
            bidder = bidder + FIRST_PERSON_ID
        hot_channel = rng.integers(0, 2, size=k) > 0
        channel_idx = np.where(hot_channel, rng.integers(0, len(HOT_CHANNELS), size=k),
                               len(HOT_CHANNELS) + rng.integers(0, CHANNELS, size=k))
        urls, channels = self._channel_url
        idx = pl.Series(channel_idx)
        return pl.DataFrame({
            "auction": auction,
            "bidder": bidder,
            "price": next_price(rng, k),
            "channel": channels.gather(idx),
            "url": urls.gather(idx),
            "dateTime": pl.Series(cfg.timestamp_ms(e)).cast(TIME),
        }).with_columns(extra=s.extra(rng, k, 32, cfg.avg_bid_bytes))
