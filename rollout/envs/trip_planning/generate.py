"""Regenerates `data.json` (the travel database) and `tasks.jsonl` (40 trips, each with a solution), seeded.

Run `python -m rollout.envs.trip_planning.generate` from the repo root. Every task is made solvable by
construction: the reference solver (env.py `solve`, through the tools) plans the cheapest trip, and the task's
budget and daily caps are then set a random margin above what that plan spends. At the end `check_env` must pass
(every reference plan valid, every perturbed one rejected), or nothing is written.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 20240917
N_TASKS = 40

CITIES = [  # name, country, description, map position in km
    ("Aldenport", "Marrowland", "A harbour city of canals, shipyards and old merchant houses on the Aune estuary.",
     (0, 0)),
    ("Brisca", "Marrowland", "A university town with a walled old centre and a busy student quarter.", (140, 60)),
    ("Corvale", "Marrowland", "A hill town known for its vineyards, stone bridges and summer music festival.",
     (90, 210)),
    ("Dunmere", "Quessa", "Quessa's capital: broad avenues, government palaces and a famous covered market.",
     (320, 40)),
    ("Elstead", "Quessa", "A lakeside spa town with thermal baths and a promenade of grand hotels.", (410, 180)),
    ("Fenwick Bay", "Quessa", "A fishing port turned seaside resort, with cliffs, coves and a lighthouse.",
     (260, 300)),
    ("Galtria", "Tirel", "A mountain city of cable cars, monasteries and alpine lakes.", (520, 320)),
    ("Harrowgate", "Tirel", "An industrial city reinvented as a design capital, full of galleries in old mills.",
     (600, 110)),
]
DISTRICTS = ["Old Town", "Harbourside", "Riverside", "North End", "Market Quarter", "Hillside", "Station Quarter",
             "Garden District"]
NAMES = ["Ashby", "Marlow", "Penrose", "Whitcombe", "Thorne", "Calloway", "Rennick", "Ostley", "Harwell", "Lindqvist",
         "Varga", "Okafor", "Brandt", "Sorel", "Quill", "Deverell", "Maddox", "Ferrante", "Halloran", "Ivers"]
ADJS = ["Silver", "Golden", "Lantern", "Willow", "Copper", "Amber", "Northern", "Quiet", "Crown", "Cedar", "Juniper",
        "Blue", "Iron", "Saffron", "Velvet", "Coral"]
ATTRACTIONS = {  # category: (name templates, price range per person, visit hours)
    "museum": (["Museum of {X}", "{City} {X} Museum"], (8, 26), (1.5, 3)),
    "park": (["{Adj} Gardens", "{Name} Park"], (0, 8), (1, 2.5)),
    "landmark": (["{Name} Tower", "Old {Name} Bridge", "{Name} Cathedral", "{Name} Castle"], (5, 30), (1, 2)),
    "gallery": (["{Name} Gallery", "The {Adj} Gallery"], (6, 22), (1, 2)),
    "market": (["{Adj} Market", "{Name} Street Market"], (0, 6), (1, 2)),
    "tour": (["{Adj} Walking Tour", "{Name} Boat Tour", "{City} Food Tour"], (18, 60), (2, 4)),
    "theater": (["{Name} Theatre", "The {Adj} Playhouse"], (25, 70), (2, 3)),
    "viewpoint": (["{Name} Lookout", "{Adj} Hill Viewpoint"], (0, 12), (0.5, 1.5)),
}
MUSEUM_THEMES = ["Maritime History", "Clockwork", "Textiles", "Natural History", "Modern Art", "Printing", "Railways",
                 "Glass", "Folk Life", "Science", "Coins", "Music"]
CUISINES = {  # cuisine: (name templates, price range per person)
    "Italian": (["Trattoria {Name}", "Casa {Name}", "The {Adj} Olive"], (16, 48)),
    "Japanese": (["{Name} Sushi Bar", "{Adj} Ramen"], (14, 70)),
    "local": (["{Name}'s Kitchen", "The {Adj} Table", "{Adj} Tavern"], (12, 45)),
    "seafood": (["The {Adj} Oyster", "{Name} Fish House"], (22, 75)),
    "vegetarian": (["{Adj} Leaf", "Green {Name}"], (12, 35)),
    "Indian": (["{Adj} Curry House", "{Name} Tandoor"], (13, 38)),
    "French": (["Bistro {Name}", "Café {Adj}"], (20, 72)),
    "Mexican": (["{Adj} Cantina", "Taquería {Name}"], (11, 32)),
}
HOTELS = {  # tier: (name templates, price range per room and night)
    "budget": (["{Name} Hostel", "{Adj} Inn", "{City} Budget Rooms"], (55, 95)),
    "standard": (["Hotel {Name}", "{Adj} Lodge", "{City} Central Hotel"], (110, 175)),
    "luxury": (["The {Name} Grand", "{Adj} Palace Hotel", "{City} Royal"], (230, 390)),
}
TIERS = ["budget", "standard", "luxury"]


def _name(rng, templates, city, taken):
    for _ in range(200):
        name = rng.choice(templates).format(Name=rng.choice(NAMES), Adj=rng.choice(ADJS), City=city,
                                            X=rng.choice(MUSEUM_THEMES))
        if name not in taken:
            taken.add(name)
            return name
    raise RuntimeError("ran out of names")


def _hours(rng, early=(8, 11), late=(16, 23)):
    return f"{rng.randint(*early):02d}:00-{rng.randint(*late):02d}:00"


def make_data(rng: random.Random) -> dict:
    data = {"cities": [], "attractions": [], "restaurants": [], "hotels": []}
    taken: set[str] = set()
    for name, country, text, (x, y) in CITIES:
        districts = rng.sample(DISTRICTS, 4)
        data["cities"].append({"name": name, "country": country, "description": text, "x_km": x, "y_km": y,
                               "districts": ", ".join(districts)})
        cats = list(ATTRACTIONS) + rng.sample(list(ATTRACTIONS), 2)  # every category, two of them twice
        for cat in cats:
            templates, (lo, hi), (d0, d1) = ATTRACTIONS[cat]
            district = rng.choice(districts)
            data["attractions"].append({
                "id": f"A{len(data['attractions']) + 1:03d}", "name": _name(rng, templates, name, taken),
                "city": name, "district": district, "category": cat, "price": rng.randint(lo, hi),
                "rating": round(rng.uniform(3.4, 4.9), 1), "duration_h": round(rng.uniform(d0, d1) * 2) / 2,
                "hours": _hours(rng), "description": f"A {cat} in the {district} district of {name}."})
        cuisines = rng.sample(list(CUISINES), 6) + rng.sample(list(CUISINES), 3)
        for cuisine in cuisines:
            templates, (lo, hi) = CUISINES[cuisine]
            data["restaurants"].append({
                "id": f"R{len(data['restaurants']) + 1:03d}", "name": _name(rng, templates, name, taken),
                "city": name, "district": rng.choice(districts), "cuisine": cuisine,
                "price_per_person": rng.randint(lo, hi), "rating": round(rng.uniform(3.2, 4.9), 1),
                "hours": _hours(rng, (11, 12), (21, 23))})
        for tier in ("budget", "budget", "standard", "standard", "luxury", "luxury"):
            templates, (lo, hi) = HOTELS[tier]
            data["hotels"].append({
                "id": f"H{len(data['hotels']) + 1:03d}", "name": _name(rng, templates, name, taken), "city": name,
                "district": rng.choice(districts), "tier": tier, "nightly_price": rng.randint(lo, hi),
                "rating": round(rng.uniform(3.0, 4.9), 1)})
    return data


def draft_task(rng: random.Random, data: dict, k: int) -> dict:
    pos = {c["name"]: (c["x_km"], c["y_km"]) for c in data["cities"]}
    a = rng.choice(list(pos))
    near = sorted((c for c in pos if c != a), key=lambda c: math.dist(pos[a], pos[c]))[:3]
    b, c = rng.sample(near, 2)
    cities = rng.choice([[a, a, a], [a, a, b], [a, b, b], [a, b, c], [a, b, c]])
    trip_cities = set(cities)
    cats = sorted({v["category"] for v in data["attractions"] if v["city"] in trip_cities})
    cuisines = sorted({v["cuisine"] for v in data["restaurants"] if v["city"] in trip_cities})
    return {
        "id": f"trip-{k:03d}", "prompt": "", "days": 3, "day_cities": cities, "people": rng.randint(1, 4),
        "attractions_per_day": rng.choice([1, 2, 2, 3]), "meals_per_day": rng.choice([1, 2, 2, 2, 3]),
        "min_hotel_tier": rng.choices(TIERS, weights=[3, 5, 2])[0],
        "must_include_category": rng.choice(cats) if rng.random() < 0.6 else None,
        "must_include_cuisine": rng.choice(cuisines) if rng.random() < 0.5 else None,
        "daily_cap_by_tier": {t: 10_000 for t in TIERS}, "budget": 10**7,  # set from the reference plan
    }


def finish_task(rng: random.Random, task: dict, cost: dict, dearest_total: int) -> dict:
    """Caps and budget a random margin above what the cheapest plan spends, the budget below what the same plan
    with the dearest allowed hotels costs (so the budget binds); the prompt."""
    top = max(d["per_person_spend"] for d in cost["days"])
    at = TIERS.index(task["min_hotel_tier"])
    base = top + rng.randint(3, 20)
    caps, cap = {}, base
    for tier in TIERS[at:]:  # pricier hotels leave less to spend during the day
        caps[tier] = max(cap, 5)
        cap -= rng.randint(20, 40)
    cap = base
    for tier in reversed(TIERS[:at]):
        cap += rng.randint(15, 30)
        caps[tier] = cap
    task["daily_cap_by_tier"] = {t: caps[t] for t in TIERS}
    task["budget"] = min(int(math.ceil(cost["total"] * rng.uniform(1.05, 1.3) / 10) * 10), dearest_total - 1)
    assert task["budget"] >= cost["total"], task["id"]
    task["prompt"] = render_prompt(task)
    return task


def render_prompt(t: dict) -> str:
    days = ", ".join(f"day {i} in {c}" for i, c in enumerate(t["day_cities"], 1))
    people = "1 person" if t["people"] == 1 else f"{t['people']} people"
    better = "" if t["min_hotel_tier"] == "luxury" else " or better"
    lines = [
        f"Plan a {t['days']}-day trip for {people}: {days[0].upper()}{days[1:]}. When a day is in another city than "
        "the day before, the group takes the train that morning.",
        f"Each day: exactly {t['attractions_per_day']} attraction(s) and {t['meals_per_day']} meal(s) at "
        "restaurants, all in that day's city, and one night in a hotel in that city, of the "
        f"{t['min_hotel_tier']} tier{better}. No attraction or restaurant may be used twice on the trip.",
    ]
    musts = []
    if t["must_include_category"]:
        musts.append(f"at least one {t['must_include_category']} attraction")
    if t["must_include_cuisine"]:
        musts.append(f"at least one meal at a {t['must_include_cuisine']} restaurant")
    if musts:
        lines.append("The trip must include " + " and ".join(musts) + ".")
    caps = ", ".join(f"{tier} ${cap}" for tier, cap in t["daily_cap_by_tier"].items())
    lines.append(
        f"Budget: the whole trip (attractions, meals, hotel rooms for two people each, train tickets) must cost at "
        f"most ${t['budget']} for the group. Each day, what one person spends on attractions and meals must stay "
        f"within a cap that depends on that night's hotel tier: {caps}.")
    lines.append("Submit the complete plan with submit_result.")
    return "\n".join(lines)


def main() -> None:
    sys.path.insert(0, str(HERE.parents[2]))
    from rollout.envs.base import check_env, load_env

    rng = random.Random(SEED)
    data = make_data(rng)
    with tempfile.TemporaryDirectory() as tmp:  # built and checked aside; written only when it all passes
        work = Path(tmp) / "trip_planning"
        shutil.copytree(HERE, work, ignore=shutil.ignore_patterns("__pycache__", "tasks.jsonl", "data.json"))
        (work / "data.json").write_text(json.dumps(data, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
        (work / "tasks.jsonl").write_text("", encoding="utf-8")
        env = load_env(str(work))
        tasks = []
        for k in range(N_TASKS):
            task = draft_task(rng, data, k)
            plan = env.reference_solution(task)[-1][1]["plan"]
            dearest = env.module.perturb_submission(task, plan)["dearest_hotels"]
            db = env.open_db()
            try:
                cost = env.module.trip_cost(db, task, plan, env.config["people_per_room"])
                dearest_total = env.module.trip_cost(db, task, dearest, env.config["people_per_room"])["total"]
            finally:
                db.close()
            tasks.append(finish_task(rng, task, cost, dearest_total))
        report = check_env(env, tasks)
        if not report["ok"]:
            raise SystemExit("check_env failed:\n" + "\n".join(report["failures"]))
    (HERE / "data.json").write_text(json.dumps(data, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    with open(HERE / "tasks.jsonl", "w", encoding="utf-8") as f:
        for task in tasks:
            f.write(json.dumps(task, ensure_ascii=False) + "\n")
    print(f"wrote {len(tasks)} tasks; check_env: {report['reference_passed']}/{report['with_reference']} reference "
          f"plans valid, {report['perturbed_failed']}/{report['perturbed']} perturbed ones rejected")


if __name__ == "__main__":
    main()
