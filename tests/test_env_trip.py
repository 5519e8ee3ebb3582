"""The trip_planning environment: its tools, every constraint its verifier checks (each failure named), and the
reference plans of all tasks (check_env)."""

from __future__ import annotations

import copy

import pytest

from rollout.envs.base import check_env, load_env

TOOLS = ["get_trip_requirements", "search_cities", "get_city_info", "list_attractions", "get_attraction",
         "list_restaurants", "get_restaurant", "list_hotels", "get_hotel", "get_transport", "estimate_cost",
         "set_hotel", "add_to_day", "remove_from_day", "get_plan", "submit_result"]


@pytest.fixture(scope="module")
def env():
    return load_env("trip_planning")


def reference_plan(env, task) -> dict:
    return copy.deepcopy(env.reference_solution(task)[-1][1]["plan"])


def score(env, task, plan) -> tuple[float, str | None]:
    """Submits `plan` through the tools and verifies it, as the rollout would."""
    s = env.reset(task)
    try:
        assert s.call("submit_result", {"plan": plan}).final
        return env.verify(task, s)
    finally:
        s.close()


def test_tools_and_schemas(env):
    assert [t["function"]["name"] for t in env.tool_schemas()] == TOOLS
    plan = env.tool_schemas()[-1]["function"]["parameters"]["properties"]["plan"]
    day = plan["properties"]["days"]["items"]
    assert day["required"] == ["city", "hotel", "attractions", "restaurants"]
    assert len(env.tasks()) == 40


def test_every_reference_plan_passes_and_every_perturbation_fails(env):
    report = check_env(env)
    assert report["ok"], report["failures"]
    assert report["reference_passed"] == 40 and report["perturbed_failed"] == report["perturbed"] >= 40 * 6


def test_the_verifier_names_each_violated_constraint(env):
    tasks = env.tasks()
    task = next(t for t in tasks if len(set(t["day_cities"])) == 3 and t["min_hotel_tier"] != "budget")
    plan = reference_plan(env, task)
    assert score(env, task, plan) == (1.0, None)
    other_city = next(t for t in tasks if task["day_cities"][0] not in t["day_cities"])["day_cities"][0]

    def broken(edit, t=task):
        p = copy.deepcopy(plan)
        edit(p["days"])
        value, reason = score(env, t, p)
        assert value == 0.0
        return reason

    assert "day 1: city is" in broken(lambda d: d[0].__setitem__("city", other_city))
    assert "was already used on day 1" in broken(lambda d: d[1]["attractions"].__setitem__(0, d[0]["attractions"][0]))
    reason = broken(lambda d: d[1]["restaurants"].pop())
    assert f"day 2: {task['meals_per_day'] - 1} restaurants, the trip asks for {task['meals_per_day']}" in reason
    assert "'A999' is not an attraction" in broken(lambda d: d[0]["attractions"].__setitem__(0, "A999"))
    assert "is not a restaurant" in broken(lambda d: d[0]["restaurants"].__setitem__(0, d[0]["attractions"][0]))
    db = env.open_db()
    try:
        far_venue = db.execute("SELECT id, city FROM attractions WHERE city != ? LIMIT 1",
                               (task["day_cities"][0],)).fetchone()
        cheap_hotel = db.execute("SELECT id FROM hotels WHERE city = ? AND tier = 'budget'",
                                 (task["day_cities"][0],)).fetchone()["id"]
        lux = db.execute("SELECT id FROM hotels WHERE city = ? AND tier = 'luxury' ORDER BY nightly_price",
                         (task["day_cities"][0],)).fetchone()["id"]
    finally:
        db.close()
    assert f"is in {far_venue['city']}, not {task['day_cities'][0]}" in broken(
        lambda d: d[0]["attractions"].__setitem__(0, far_venue["id"]))
    assert f"is budget, below {task['min_hotel_tier']}" in broken(lambda d: d[0].__setitem__("hotel", cheap_hotel))
    assert "no plan was submitted" in env.verify(task, env.reset(task))[1]

    cost = _cost(env, task, plan)
    tight = dict(task, budget=cost["total"] - 1)
    assert f"total cost {cost['total']} is over the budget of {cost['total'] - 1}" in score(env, tight, plan)[1]
    assert score(env, dict(task, budget=cost["total"]), plan) == (1.0, None)  # the budget is inclusive
    # The cap follows the night's hotel tier: the same day under a luxury hotel meets the luxury cap only.
    spend = cost["days"][0]["per_person_spend"]
    caps = dict(task["daily_cap_by_tier"], luxury=spend - 1)
    capped = dict(task, daily_cap_by_tier=caps, budget=10**7)
    p = copy.deepcopy(plan)
    p["days"][0]["hotel"] = lux
    assert f"day 1: {spend} dollars per person on attractions and meals, over the {spend - 1} cap for a luxury " \
        "hotel night" in score(env, capped, p)[1]
    caps["luxury"] = max(d["per_person_spend"] for d in cost["days"])  # other days may have luxury nights too
    assert score(env, capped, p) == (1.0, None)
    used = {c for d in plan["days"] for c in d["attractions"]}
    db = env.open_db()
    try:
        cats = {r["category"] for r in db.execute(
            f"SELECT category FROM attractions WHERE id IN ({','.join('?' * len(used))})", sorted(used))}
    finally:
        db.close()
    missing = next(c for c in ("museum", "park", "landmark", "gallery", "market", "tour", "theater", "viewpoint")
                   if c not in cats)
    assert f"no {missing} attraction in the trip" in score(env, dict(task, must_include_category=missing), plan)[1]


def _cost(env, task, plan) -> dict:
    s = env.reset(task)
    try:
        return s.call("estimate_cost", {"plan": plan}).value
    finally:
        s.close()


def test_tools_look_things_up_and_build_the_working_plan(env):
    task = env.tasks()[0]
    s = env.reset(task)
    try:
        city = task["day_cities"][0]
        req = s.call("get_trip_requirements", {}).value
        assert req["day_cities"] == task["day_cities"] and req["budget"] == task["budget"]
        hotels = s.call("list_hotels", {"city": city.upper(), "tier": "standard"}).value
        assert hotels and {h["tier"] for h in hotels} <= {"standard", "luxury"}
        assert [h["nightly_price"] for h in hotels] == sorted(h["nightly_price"] for h in hotels)
        r = s.call("list_hotels", {"city": "Atlantis"})
        assert r.status == "error" and "the cities are:" in r.content and city in r.content
        assert s.call("list_hotels", {"city": city, "tier": "palace"}).status == "error"
        museums = s.call("list_attractions", {"city": city, "category": "museum", "max_price": 100}).value
        assert museums and all(a["category"] == "museum" for a in museums)
        info = s.call("get_city_info", {"city": city}).value
        assert info["attractions_count"] == 10 and info["hotels_count"] == 6
        assert s.call("search_cities", {"query": info["country"]}).value
        assert s.call("get_attraction", {"attraction_id": museums[0]["id"]}).value["city"] == city
        assert s.call("get_attraction", {"attraction_id": hotels[0]["id"]}).status == "error"
        other = next(c["name"] for c in s.call("search_cities", {}).value if c["name"] != city)
        there = s.call("get_transport", {"from_city": city, "to_city": other}).value
        back = s.call("get_transport", {"from_city": other, "to_city": city}).value
        assert there["price_per_person"] == back["price_per_person"] > 8
        assert s.call("get_transport", {"from_city": city, "to_city": city}).status == "error"
        assert "Day 1: hotel" in s.call("set_hotel", {"day": 1, "hotel_id": hotels[0]["id"]}).content
        assert s.call("set_hotel", {"day": 9, "hotel_id": hotels[0]["id"]}).status == "error"
        far = s.call("list_attractions", {"city": other}).value[0]["id"]
        assert "Note: it is in" in s.call("add_to_day", {"day": 1, "venue_id": far}).content
        assert s.call("remove_from_day", {"day": 1, "venue_id": far}).status == "ok"
        assert s.call("remove_from_day", {"day": 1, "venue_id": far}).status == "error"
        assert s.call("add_to_day", {"day": 1, "venue_id": hotels[0]["id"]}).status == "error"
        s.call("add_to_day", {"day": 1, "venue_id": museums[0]["id"]})
        draft = s.call("get_plan", {}).value
        assert draft["plan"]["days"][0]["attractions"] == [museums[0]["id"]]
        assert draft["cost"] is None  # days 2 and 3 have no hotel yet
        r = s.call("estimate_cost", {"plan": draft["plan"]})
        assert r.status == "error" and "unknown ids" in r.content
        assert s.call("submit_result", {"plan": {"days": [{"city": city}]}}).status == "bad_args"
    finally:
        s.close()
