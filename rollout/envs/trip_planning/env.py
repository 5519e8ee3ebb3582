"""Trip planning (the DeepSeek-V3.2 paper's example environment): plan a multi-day trip from a travel database
under hard constraints, checked by the verifier against the database.

A task (tasks.jsonl, made by generate.py) fixes: the city of each day, the number of people, how many attractions
and meals (restaurants) per day, the minimum hotel tier, an optional category of attraction and cuisine to include
at least once, the total budget of the group, and a daily spending cap per person (attractions + meals) that
depends on that night's hotel tier: the more expensive the hotel, the less there is to spend during the day.

Costs (one function, `trip_cost`, used by estimate_cost, get_plan and the verifier, so the tools never disagree
with the verifier): attractions at their price per person, meals at the restaurant's price per person, one hotel
room per `people_per_room` people per night, and a train ticket per person whenever a day is in another city than
the day before. All prices are whole dollars, so comparisons are exact.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, TypedDict

from rollout.envs.base import ToolError, create_table

_HERE = Path(__file__).resolve().parent
KINDS = {"A": ("attractions", "attraction"), "R": ("restaurants", "restaurant"), "H": ("hotels", "hotel")}


class DayPlan(TypedDict):
    city: Annotated[str, "the city of this day"]
    hotel: Annotated[str, "the id of the hotel for this day's night, e.g. H005"]
    attractions: Annotated[list[str], "the ids of this day's attractions, e.g. [\"A012\", \"A015\"]"]
    restaurants: Annotated[list[str], "the ids of this day's restaurants (one per meal), e.g. [\"R034\"]"]


class TripPlan(TypedDict):
    days: Annotated[list[DayPlan], "one entry per day of the trip, in order"]


# ------------------------------------------------------------------------------------------------- database
def build_db(conn, env_dir):
    data = json.loads((env_dir / "data.json").read_text(encoding="utf-8"))
    for table in ("cities", "attractions", "restaurants", "hotels"):
        create_table(conn, table, data[table], primary_key="name" if table == "cities" else "id")
    for table in ("attractions", "restaurants", "hotels"):
        conn.execute(f"CREATE INDEX {table}_city ON {table} (city)")


def _city(state, name: str) -> dict:
    row = state.db.execute("SELECT * FROM cities WHERE lower(name) = lower(?)", (name.strip(),)).fetchone()
    if row is None:
        names = [r["name"] for r in state.db.execute("SELECT name FROM cities ORDER BY name")]
        raise ToolError(f"no city named {name!r}; the cities are: {', '.join(names)}")
    return dict(row)


def _venue(db, venue_id: str) -> dict | None:
    """The attraction, restaurant or hotel with this id (its first letter says which), or None."""
    vid = str(venue_id).strip().upper()
    if vid[:1] not in KINDS:
        return None
    row = db.execute(f"SELECT * FROM {KINDS[vid[0]][0]} WHERE id = ?", (vid,)).fetchone()
    return None if row is None else {**dict(row), "kind": KINDS[vid[0]][1]}


def _get(state, venue_id: str, prefix: str) -> dict:
    venue = _venue(state.db, venue_id)
    if venue is None or not str(venue_id).strip().upper().startswith(prefix):
        raise ToolError(f"no {KINDS[prefix][1]} with id {venue_id!r} ({KINDS[prefix][1]} ids start with {prefix})")
    venue.pop("kind")
    return venue


def transport(db, from_city: str, to_city: str) -> dict:
    """Train between two cities: distance from the map coordinates, ticket 8 dollars + 12 cents per km."""
    a = db.execute("SELECT * FROM cities WHERE name = ?", (from_city,)).fetchone()
    b = db.execute("SELECT * FROM cities WHERE name = ?", (to_city,)).fetchone()
    km = round(math.hypot(a["x_km"] - b["x_km"], a["y_km"] - b["y_km"]))
    return {"from": from_city, "to": to_city, "distance_km": km, "price_per_person": 8 + round(km * 0.12),
            "duration_h": round(km / 110 + 0.4, 1)}


def trip_cost(db, task: dict, plan: dict, people_per_room: int) -> dict:
    """The cost of a plan for the task's group, per day and in total; ids that do not exist are listed and count
    nothing."""
    people = int(task["people"])
    rooms = math.ceil(people / people_per_room)
    days, unknown, total, prev_city = [], [], 0, None
    for i, day in enumerate(plan.get("days", []), 1):
        spend = 0  # per person: attractions and meals
        for vid in list(day.get("attractions", [])) + list(day.get("restaurants", [])):
            venue = _venue(db, vid)
            if venue is None or venue["kind"] == "hotel":
                unknown.append(vid)
            else:
                spend += venue["price"] if venue["kind"] == "attraction" else venue["price_per_person"]
        hotel = _venue(db, day.get("hotel", ""))
        hotel_cost = hotel["nightly_price"] * rooms if hotel and hotel["kind"] == "hotel" else 0
        if not (hotel and hotel["kind"] == "hotel"):
            unknown.append(day.get("hotel"))
        city = _known_city(db, day.get("city"))
        ticket = 0
        if prev_city and city and city != prev_city:
            ticket = transport(db, prev_city, city)["price_per_person"] * people
        prev_city = city or prev_city
        day_total = spend * people + hotel_cost + ticket
        total += day_total
        days.append({"day": i, "city": day.get("city"), "per_person_spend": spend, "activities": spend * people,
                     "hotel": hotel_cost, "transport": ticket, "total": day_total})
    return {"people": people, "rooms": rooms, "days": days, "total": total, "unknown_ids": unknown}


def _known_city(db, name) -> str | None:
    row = db.execute("SELECT name FROM cities WHERE lower(name) = lower(?)", (str(name or "").strip(),)).fetchone()
    return row["name"] if row else None


# ---------------------------------------------------------------------------------------------------- tools
def get_trip_requirements(state) -> dict:
    """The constraints of the trip to plan, as structured data (the same as in the request).

    Returns:
        days, day_cities (the city of each day), people, attractions_per_day, meals_per_day, min_hotel_tier,
        tiers (cheapest first), daily_cap_by_tier (per person, attractions + meals, by that night's hotel tier),
        must_include_category, must_include_cuisine (null when free), budget (total for the group, dollars),
        people_per_room.
    """
    keys = ("days", "day_cities", "people", "attractions_per_day", "meals_per_day", "min_hotel_tier",
            "daily_cap_by_tier", "must_include_category", "must_include_cuisine", "budget")
    return {**{k: state.task.get(k) for k in keys}, "tiers": state.config["tiers"],
            "people_per_room": state.config["people_per_room"]}


def search_cities(state, query: str = "") -> list[dict]:
    """Find cities whose name or country contains the query (all cities when it is empty).

    Args:
        query: part of a city or country name, case-insensitive.
    """
    like = f"%{query.strip().lower()}%"
    rows = state.db.execute("SELECT name, country FROM cities WHERE lower(name) LIKE ? OR lower(country) LIKE ? "
                            "ORDER BY name", (like, like)).fetchall()
    return [dict(r) for r in rows]


def get_city_info(state, city: str) -> dict:
    """Facts about a city: country, description, districts, and how many attractions, restaurants and hotels
    the database has there.

    Args:
        city: the city name.
    """
    info = _city(state, city)
    for table in ("attractions", "restaurants", "hotels"):
        info[f"{table}_count"] = state.db.execute(f"SELECT count(*) FROM {table} WHERE city = ?",
                                                  (info["name"],)).fetchone()[0]
    return info


def _list_venues(state, city: str, table: str, kind_col: str, kind: str | None, price_col: str,
                 max_price: int | None) -> list[dict]:
    """A city's attractions or restaurants, optionally of one kind and up to a price, cheapest first."""
    sql = f"SELECT id, name, {kind_col}, {price_col}, rating FROM {table} WHERE city = ?"
    params: list = [_city(state, city)["name"]]
    if kind:
        sql, params = sql + f" AND lower({kind_col}) = lower(?)", params + [kind.strip()]
    if max_price is not None:
        sql, params = sql + f" AND {price_col} <= ?", params + [max_price]
    return [dict(r) for r in state.db.execute(sql + f" ORDER BY {price_col}, id", params)]


def list_attractions(state, city: str, category: str | None = None, max_price: int | None = None) -> list[dict]:
    """The attractions of a city, cheapest first.

    Args:
        city: the city name.
        category: only this category (museum, park, landmark, gallery, market, tour, theater, viewpoint).
        max_price: only attractions costing at most this much per person, in dollars.
    """
    return _list_venues(state, city, "attractions", "category", category, "price", max_price)


def get_attraction(state, attraction_id: str) -> dict:
    """Everything about one attraction: city, district, category, price per person, rating, opening hours,
    typical visit length and a description.

    Args:
        attraction_id: its id, e.g. A012.
    """
    return _get(state, attraction_id, "A")


def list_restaurants(state, city: str, cuisine: str | None = None, max_price: int | None = None) -> list[dict]:
    """The restaurants of a city, cheapest first.

    Args:
        city: the city name.
        cuisine: only this cuisine (e.g. Italian, Japanese, local, seafood, vegetarian).
        max_price: only restaurants costing at most this much per person, in dollars.
    """
    return _list_venues(state, city, "restaurants", "cuisine", cuisine, "price_per_person", max_price)


def get_restaurant(state, restaurant_id: str) -> dict:
    """Everything about one restaurant: city, district, cuisine, price per person, rating and opening hours.

    Args:
        restaurant_id: its id, e.g. R034.
    """
    return _get(state, restaurant_id, "R")


def list_hotels(state, city: str, tier: str | None = None) -> list[dict]:
    """The hotels of a city, cheapest first. Prices are per room and night; a room sleeps two people.

    Args:
        city: the city name.
        tier: only this tier or better (budget, standard, luxury).
    """
    name = _city(state, city)["name"]
    tiers = state.config["tiers"]
    allowed = tiers
    if tier:
        if tier.strip().lower() not in tiers:
            raise ToolError(f"unknown tier {tier!r}; the tiers are {', '.join(tiers)}")
        allowed = tiers[tiers.index(tier.strip().lower()):]
    rows = state.db.execute(
        f"SELECT id, name, tier, nightly_price, rating FROM hotels WHERE city = ? AND tier IN "
        f"({', '.join('?' * len(allowed))}) ORDER BY nightly_price, id", [name, *allowed])
    return [dict(r) for r in rows]


def get_hotel(state, hotel_id: str) -> dict:
    """Everything about one hotel: city, district, tier, price per room and night, rating.

    Args:
        hotel_id: its id, e.g. H005.
    """
    return _get(state, hotel_id, "H")


def get_transport(state, from_city: str, to_city: str) -> dict:
    """The train between two cities: distance, ticket price per person and travel time.

    Args:
        from_city: where the train leaves.
        to_city: where it arrives.
    """
    a, b = _city(state, from_city)["name"], _city(state, to_city)["name"]
    if a == b:
        raise ToolError("the two cities are the same: no train needed")
    return transport(state.db, a, b)


def estimate_cost(state, plan: TripPlan) -> dict:
    """The cost of a plan for the trip's group: per day (per-person spending on attractions and meals, the
    group's activities, hotel rooms, train tickets) and in total, with the budget left. It checks costs only,
    not the other constraints.

    Args:
        plan: the plan, in the same form as for submit_result.
    """
    cost = trip_cost(state.db, state.task, plan, state.config["people_per_room"])
    if cost["unknown_ids"]:
        raise ToolError(f"unknown ids (or wrong kind) in the plan: {', '.join(map(str, cost['unknown_ids']))}")
    return {**cost, "budget": state.task["budget"], "budget_left": state.task["budget"] - cost["total"]}


def _draft_day(state, day: int) -> dict:
    if not 1 <= day <= len(state.draft):
        raise ToolError(f"day must be between 1 and {len(state.draft)}")
    return state.draft[day - 1]


def set_hotel(state, day: int, hotel_id: str) -> str:
    """Choose the hotel for one day's night in the working plan (replacing any earlier choice).

    Args:
        day: the day, from 1.
        hotel_id: the hotel's id, e.g. H005.
    """
    entry = _draft_day(state, day)
    hotel = _get(state, hotel_id, "H")
    entry["hotel"] = hotel["id"]
    note = "" if hotel["city"] == entry["city"] else f" Note: it is in {hotel['city']}, day {day} is in {entry['city']}."
    return f"Day {day}: hotel {hotel['id']} ({hotel['name']}, {hotel['tier']}).{note}"


def add_to_day(state, day: int, venue_id: str) -> str:
    """Add an attraction or a restaurant (a meal) to one day of the working plan.

    Args:
        day: the day, from 1.
        venue_id: an attraction id (A...) or a restaurant id (R...).
    """
    entry = _draft_day(state, day)
    venue = _venue(state.db, venue_id)
    if venue is None or venue["kind"] == "hotel":
        raise ToolError(f"no attraction or restaurant with id {venue_id!r} (hotels go in with set_hotel)")
    slot = "attractions" if venue["kind"] == "attraction" else "restaurants"
    entry[slot].append(venue["id"])
    notes = []
    if venue["city"] != entry["city"]:
        notes.append(f"it is in {venue['city']}, day {day} is in {entry['city']}")
    used = [v for d in state.draft for v in d["attractions"] + d["restaurants"]]
    if used.count(venue["id"]) > 1:
        notes.append("it is already in the plan")
    return f"Day {day}: added {venue['kind']} {venue['id']} ({venue['name']})." + (
        f" Note: {'; '.join(notes)}." if notes else "")


def remove_from_day(state, day: int, venue_id: str) -> str:
    """Remove an attraction or a restaurant from one day of the working plan.

    Args:
        day: the day, from 1.
        venue_id: the id to remove.
    """
    entry = _draft_day(state, day)
    vid = venue_id.strip().upper()
    for slot in ("attractions", "restaurants"):
        if vid in entry[slot]:
            entry[slot].remove(vid)
            return f"Day {day}: removed {vid}."
    raise ToolError(f"{venue_id!r} is not in day {day}")


def get_plan(state) -> dict:
    """The working plan built with set_hotel and add_to_day (in the form submit_result takes), with its cost.

    Returns:
        {"plan": the plan, "cost": the estimate_cost breakdown, or null while an id is missing}.
    """
    plan = {"days": [dict(d, attractions=list(d["attractions"]), restaurants=list(d["restaurants"]))
                     for d in state.draft]}
    cost = trip_cost(state.db, state.task, plan, state.config["people_per_room"])
    return {"plan": plan, "cost": None if cost["unknown_ids"] else cost}


def submit_result(state, plan: TripPlan) -> str:
    """Submit the final plan; this ends the episode. Only the first submission counts.

    Args:
        plan: {"days": [{"city", "hotel", "attractions": [...], "restaurants": [...]}, ...]}, one entry per day.
    """
    return "Plan submitted."


TOOLS = [get_trip_requirements, search_cities, get_city_info, list_attractions, get_attraction, list_restaurants,
         get_restaurant, list_hotels, get_hotel, get_transport, estimate_cost, set_hotel, add_to_day,
         remove_from_day, get_plan, submit_result]


def init_state(state):
    state.draft = [{"city": c, "hotel": "", "attractions": [], "restaurants": []} for c in state.task["day_cities"]]


# ------------------------------------------------------------------------------------------------- verifier
def check_plan(db, task: dict, plan, config: dict) -> list[str]:
    """Every violated constraint of `plan`, each in words; empty when the plan is valid."""
    if not isinstance(plan, dict) or not isinstance(plan.get("days"), list):
        return ["the plan is not an object with a 'days' list"]
    days, problems = plan["days"], []
    if len(days) != task["days"]:
        return [f"the plan has {len(days)} days, the trip has {task['days']}"]
    tiers = config["tiers"]
    seen: dict[str, int] = {}
    have_category = have_cuisine = False
    for i, (day, city) in enumerate(zip(days, task["day_cities"]), 1):
        if day.get("city") != city:
            problems.append(f"day {i}: city is {day.get('city')!r}, the trip is in {city}")
        hotel = _venue(db, day.get("hotel", ""))
        tier = None
        if hotel is None or hotel["kind"] != "hotel":
            problems.append(f"day {i}: {day.get('hotel')!r} is not a hotel")
        else:
            tier = hotel["tier"]
            if hotel["city"] != city:
                problems.append(f"day {i}: hotel {hotel['id']} is in {hotel['city']}, not {city}")
            if tiers.index(tier) < tiers.index(task["min_hotel_tier"]):
                problems.append(f"day {i}: hotel {hotel['id']} is {tier}, below {task['min_hotel_tier']}")
        spend = 0
        for slot, kind, want in (("attractions", "attraction", task["attractions_per_day"]),
                                 ("restaurants", "restaurant", task["meals_per_day"])):
            ids = day.get(slot, [])
            if len(ids) != want:
                problems.append(f"day {i}: {len(ids)} {slot}, the trip asks for {want}")
            for vid in ids:
                venue = _venue(db, vid)
                if venue is None or venue["kind"] != kind:
                    problems.append(f"day {i}: {vid!r} is not a{'n' if kind[0] == 'a' else ''} {kind}")
                    continue
                if venue["city"] != city:
                    problems.append(f"day {i}: {kind} {venue['id']} is in {venue['city']}, not {city}")
                if venue["id"] in seen:
                    problems.append(f"day {i}: {venue['id']} was already used on day {seen[venue['id']]}")
                seen.setdefault(venue["id"], i)
                spend += venue["price"] if kind == "attraction" else venue["price_per_person"]
                have_category |= kind == "attraction" and venue["category"] == task.get("must_include_category")
                have_cuisine |= kind == "restaurant" and venue["cuisine"] == task.get("must_include_cuisine")
        if tier is not None and spend > task["daily_cap_by_tier"][tier]:
            problems.append(f"day {i}: {spend} dollars per person on attractions and meals, over the "
                            f"{task['daily_cap_by_tier'][tier]} cap for a {tier} hotel night")
    if task.get("must_include_category") and not have_category:
        problems.append(f"no {task['must_include_category']} attraction in the trip")
    if task.get("must_include_cuisine") and not have_cuisine:
        problems.append(f"no {task['must_include_cuisine']} restaurant in the trip")
    cost = trip_cost(db, task, plan, config["people_per_room"])
    if cost["total"] > task["budget"]:
        problems.append(f"total cost {cost['total']} is over the budget of {task['budget']}")
    return problems


def verify(task, state):
    if not state.submitted:
        return 0.0, "no plan was submitted"
    problems = check_plan(state.db, task, state.submission, state.config)
    if problems:
        more = f" (and {len(problems) - 6} more)" if len(problems) > 6 else ""
        return 0.0, "; ".join(problems[:6]) + more
    return 1.0, None


# ---------------------------------------------------------------------------------------- reference solver
def choose(req: dict, attractions: dict, restaurants: dict, hotels: dict) -> list[dict]:
    """The cheapest plan from the listings (cheapest allowed hotel; the cheapest venue of the required category
    and cuisine anywhere on the trip, then the cheapest unused venues of each day's city)."""
    cities = req["day_cities"]
    picks = {"attractions": [[] for _ in cities], "restaurants": [[] for _ in cities]}
    used: set[str] = set()
    for slot, listing, key, want in (("attractions", attractions, "category", req["must_include_category"]),
                                     ("restaurants", restaurants, "cuisine", req["must_include_cuisine"])):
        if want:
            options = [(v["price" if slot == "attractions" else "price_per_person"], v["id"], i)
                       for i, c in enumerate(cities) for v in listing[c] if v[key] == want]
            _, vid, i = min(options)
            picks[slot][i].append(vid)
            used.add(vid)
    plan = []
    for i, city in enumerate(cities):
        for slot, listing, want in (("attractions", attractions, req["attractions_per_day"]),
                                    ("restaurants", restaurants, req["meals_per_day"])):
            for venue in listing[city]:  # listed cheapest first
                if len(picks[slot][i]) >= want:
                    break
                if venue["id"] not in used:
                    picks[slot][i].append(venue["id"])
                    used.add(venue["id"])
        plan.append({"city": city, "hotel": hotels[city][0]["id"], "attractions": picks["attractions"][i],
                     "restaurants": picks["restaurants"][i]})
    return plan


def solve(task, call):
    req = call("get_trip_requirements")
    attractions, restaurants, hotels = {}, {}, {}
    for city in dict.fromkeys(req["day_cities"]):
        hotels[city] = call("list_hotels", city=city, tier=req["min_hotel_tier"])
        attractions[city] = call("list_attractions", city=city)
        restaurants[city] = call("list_restaurants", city=city)
    for day, entry in enumerate(choose(req, attractions, restaurants, hotels), 1):
        call("set_hotel", day=day, hotel_id=entry["hotel"])
        for vid in entry["attractions"] + entry["restaurants"]:
            call("add_to_day", day=day, venue_id=vid)
    plan = call("get_plan")["plan"]
    call("estimate_cost", plan=plan)
    call("submit_result", plan=plan)


def perturb_submission(task, plan) -> dict:
    """Wrong versions of a valid plan for check_env, each breaking one kind of constraint."""
    def edited(fn):
        copy = json.loads(json.dumps(plan))
        fn(copy["days"])
        return copy

    data = json.loads((_HERE / "data.json").read_text(encoding="utf-8"))
    by_price = sorted(data["hotels"], key=lambda h: -h["nightly_price"])
    out = {
        "repeated_venue": edited(lambda d: d[-1]["restaurants"].__setitem__(0, d[0]["restaurants"][0])),
        "missing_meal": edited(lambda d: d[-1]["restaurants"].pop()),
        "unknown_id": edited(lambda d: d[0]["attractions"].__setitem__(0, "A999")),
        "day_swapped_city": edited(lambda d: d[0].__setitem__("city", next(
            c["name"] for c in data["cities"] if c["name"] != d[0]["city"]))),
        "dearest_hotels": edited(lambda d: [day.__setitem__("hotel", next(
            h["id"] for h in by_price if h["city"] == day["city"])) for day in d]),
        "hotel_elsewhere": edited(lambda d: d[0].__setitem__("hotel", next(
            h["id"] for h in data["hotels"] if h["city"] != d[0]["city"]))),
    }
    if task["min_hotel_tier"] != "budget":
        out["hotel_below_tier"] = edited(lambda d: d[0].__setitem__("hotel", next(
            h["id"] for h in data["hotels"] if h["city"] == d[0]["city"] and h["tier"] == "budget")))
    return out

