"""Regenerates the long search task set, seeded: `docs.jsonl` (an encyclopedia of a fictional world, one long article
per entity), `tasks.jsonl` (the training tasks) and the held-out tasks (`rl/bundled/eval/search_long.jsonl`, where
the other held-out sets live, `bundled:eval/search_long.jsonl` in a config).

    python -m rollout.envs.search_long.generate [--out DIR]   (from the repo root; --out: all three files in DIR)

Why it is built like this: the environment exists to test context management (agent.context_strategy), so a task
must need more tokens than a context window holds when solved the intended way. Each task is a chain of 5 to 8
articles ("Start from Ada Vell. Find the town where Ada Vell was born, then the bridge in that town, then the company
that built that bridge, then the founder of that company. In what year was that founder born?"): the name needed
for the next search is learnt from the article just read, so every hop is a search plus an open_document, and
every article is long (a few key facts scattered among filler facts: numbers, years, minor names). Solved that
way, rendered as the agent loop renders it (SmolLM2's tokenizer, with the system prompt of
benchmarks/context_strategies.py), a held-out task takes 4529 / 5760 / 7014 tokens (min / median / max; training
tasks 4551 / 5757 / 7152): 2.2-3.5x a 2048-token window, 1.5-2.3x a 3072-token one. An article is 277-354 tokens.
tests/test_env_search_long.py checks it (`benchmarks/context_strategies.py --reference` prints it).

The world is a graph of people, towns, bridges, companies, universities and rivers whose relations are functional
(a town has one bridge, one river and one mayor; a bridge one builder and one engineer; a company one founder and
one seat; a person one birthplace, one university and at most one mentor), so every chain names exactly one entity
at each step. Filler sentences name only things that have no article, so they add reading, not ambiguity; their
years and numbers are the distractors. Chains never visit an entity twice. Held-out tasks start from entities that
no training task starts from.

Everything comes from one `random.Random(SEED)` walked in a fixed order (no set or dict iteration that depends on
hashing), so the output is byte-identical on every run; at the end every task's reference solution is checked
through the tools (`check_env`, which also needs each hop's article among the first five search results) before
anything is written.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
EVAL_PATH = ROOT / "rl" / "bundled" / "eval" / "search_long.jsonl"
SEED = 20261127
N_TRAIN, N_EVAL = 48, 16
HOPS = (5, 6, 7, 8)  # articles per task (each a search and an open_document); equal shares of each

FIRST = ["Ada", "Bertil", "Casimir", "Dagny", "Edvin", "Freya", "Gunnar", "Hedda", "Ivo", "Jorun", "Kasper", "Liv",
         "Magnus", "Nora", "Odile", "Pelle", "Runa", "Sigrid", "Tobias", "Ulla", "Valter", "Wilma", "Yrsa", "Anselm",
         "Brita", "Corin", "Dorota", "Emrik", "Fenna", "Greta", "Halvard", "Ingrid", "Joris", "Katrin", "Leopold",
         "Marit", "Nils", "Oona", "Petra", "Rasmus"]
LAST = ["Vell", "Ostrander", "Kjeld", "Marrick", "Tessaly", "Brannock", "Quill", "Havers", "Lindqvist", "Stray",
        "Dorrance", "Fennimore", "Garrow", "Hallett", "Isberg", "Jessop", "Kettering", "Lowther", "Mabry", "Norcott",
        "Oakes", "Pellam", "Ravenhill", "Sallow", "Thursby", "Umber", "Varden", "Wexley", "Yarrow", "Zell", "Ashcombe",
        "Blythe", "Corvan", "Drummond", "Elsworth", "Farrant", "Gilchrist", "Hurst", "Ingram", "Jarrow", "Kinloch",
        "Larkin", "Merriday", "Nethercott", "Orme", "Penhallow", "Rook", "Sutter", "Trelawny", "Wick"]
TOWN_HEAD = ["Ash", "Brenn", "Corr", "Dal", "Elm", "Fen", "Gal", "Harl", "Ister", "Kel", "Lorn", "Marr", "Nes", "Orl",
             "Pell", "Quen", "Rav", "Sel", "Tarn", "Ulv", "Vask", "Wend", "Yst", "Brack"]
TOWN_TAIL = ["ford", "mere", "wick", "holt", "stead", "by", "ton", "vale", "haven", "moor", "dale", "minster"]
RIVERS = ["Aune", "Silt", "Vessa", "Orme", "Tallow", "Keld", "Brisk", "Lune", "Marrow", "Dunn", "Essen", "Wyre"]
COUNTRIES = ["Velany", "Carreth", "Sollin"]
ADJ = ["Amber", "Copper", "Lantern", "Willow", "Juniper", "Cedar", "Saffron", "Heron", "Granite", "Linden", "Beacon",
       "Thistle", "Marble", "Falcon", "Harbour", "Rowan", "Quarry", "Orchard", "Meadow", "Ember"]
INDUSTRY = ["construction", "steel", "engineering", "shipbuilding", "ironworks", "cement", "railway building"]
COMPANY_FORMS = ["{L} & {L2}", "{A} Ironworks", "{L} Engineering", "{A} Construction", "{L} Steel", "{L} Brothers",
                 "{A} Bridge Company", "{L} & Sons"]
PROFESSIONS = ["civil engineer", "architect", "industrialist", "physicist", "surveyor", "chemist", "economist",
               "mathematician", "cartographer", "geologist", "politician", "historian"]
BRIDGE_KINDS = ["stone arch", "steel truss", "suspension", "cantilever", "cast-iron arch", "concrete beam"]
UNI_FORMS = ["University of {T}", "{T} Polytechnic", "{A} College", "{L} Institute of Technology"]
SEAS = ["the Grey Sound", "the Northern Bight", "the Sea of Carreth", "Lake Sollin"]

# Banks for the filler: none of these names has an article.
MINOR_FIRST = ["Agnes", "Boris", "Clara", "Dmitri", "Elise", "Felix", "Helga", "Jonas", "Karin", "Lukas", "Mira",
               "Otto", "Paula", "Stefan", "Tilda", "Viktor"]
MINOR_LAST = ["Brandt", "Castell", "Dahl", "Eberle", "Falk", "Grimm", "Holm", "Janek", "Krall", "Lutz", "Moser",
              "Pfeil", "Roth", "Seidel", "Tamm", "Wolff"]
PRODUCTS = ["barometers", "ferry engines", "signal lamps", "rail couplings", "typewriters", "weighing scales",
            "diving bells", "water meters", "telegraph keys", "cast-iron stoves", "crane hooks", "boiler plates"]
FOODS = ["smoked eel", "barley cakes", "plum brandy", "rye dumplings", "salted herring", "honey bread",
         "mushroom broth", "juniper sausage", "apple cider", "sour cherry pie"]
ANIMALS = ["heron", "stag", "otter", "falcon", "boar", "swan", "lynx", "raven", "salmon", "badger"]
BIRDS = ["herons", "swans", "kingfishers", "cormorants", "terns", "grebes"]
OBJECTS = ["key", "lantern", "anchor", "hammer", "wheat sheaf", "bell", "oar", "compass"]
COLOURS = ["green", "dark red", "ochre", "slate blue", "white", "black", "silver grey", "deep blue"]
MONTHS = ["March", "April", "May", "June", "July", "August", "September", "October"]
HOBBIES = ["chess", "beekeeping", "rowing", "birdwatching", "violin playing", "mountain walking", "fencing",
           "botany"]
TRAITS = ["patient but stubborn", "quick-tempered and generous", "shy in company", "meticulous", "cheerful",
          "famously absent-minded"]
FIELDS = ["hydraulics", "metallurgy", "statistics", "optics", "land surveying", "structural analysis", "acoustics"]
LANGUAGES = ["Carrethi", "Sollinese", "Old Velanian", "Latin", "Greek"]
FISH = ["trout", "pike", "grayling", "perch", "eel", "bream"]
GOODS = ["timber", "salt", "grain", "coal", "wool", "slate"]
MATERIALS = ["granite", "sandstone", "riveted steel", "reinforced concrete", "cast iron", "brick"]


class Names:
    """Unique names: `make` draws from the seeded generator, and a name already taken is drawn again."""

    def __init__(self):
        self.used = set()

    def take(self, make) -> str:
        for _ in range(1000):
            name = make()
            if name not in self.used:
                self.used.add(name)
                return name
        raise RuntimeError("ran out of names: widen the banks")


def slug(name: str) -> str:
    return "_".join("".join(c if c.isalnum() else " " for c in name.lower()).split())


# ------------------------------------------------------------------------------------------------------------ world
def make_world(rng: random.Random) -> dict[str, dict]:
    """The entities, each {id, type, name, year (or length_km), relations: {rel: id}, ...}, in creation order."""
    names = Names()
    world: dict[str, dict] = {}

    def add(type_: str, name: str, **fields) -> dict:
        e = {"id": slug(name), "type": type_, "name": name, "rel": {}, **fields}
        assert e["id"] not in world, e["id"]
        world[e["id"]] = e
        return e

    rivers = [add("river", f"River {r}", short=r, length_km=rng.randint(60, 640), country=rng.choice(COUNTRIES),
                  sea=rng.choice(SEAS)) for r in RIVERS[:10]]
    towns = [add("town", names.take(lambda: rng.choice(TOWN_HEAD) + rng.choice(TOWN_TAIL)),
                 year=rng.randint(880, 1690), country=rng.choice(COUNTRIES)) for _ in range(26)]
    people = []
    for _ in range(64):
        name = names.take(lambda: f"{rng.choice(FIRST)} {rng.choice(LAST)}")
        people.append(add("person", name, year=rng.randint(1790, 1965), she=rng.random() < 0.5,
                          profession=rng.choice(PROFESSIONS)))
    surnames = [p["name"].split()[1] for p in people]
    companies = []
    for _ in range(18):
        form = rng.choice(COMPANY_FORMS)
        name = names.take(lambda: form.format(L=rng.choice(surnames), L2=rng.choice(surnames), A=rng.choice(ADJ)))
        companies.append(add("company", name, year=rng.randint(1830, 1975), industry=rng.choice(INDUSTRY)))
    universities = []
    for _ in range(8):
        form, town = rng.choice(UNI_FORMS), rng.choice(towns)  # one named after a town stands in it
        name = names.take(lambda: form.format(T=town["name"], A=rng.choice(ADJ), L=rng.choice(surnames)))
        universities.append(add("university", name, year=rng.randint(1480, 1920)))
        universities[-1]["rel"]["town"] = town["id"]
    bridges = []
    for town in towns:  # one bridge per town: "the bridge in <town>" names one
        name = names.take(lambda: f"{rng.choice([rng.choice(ADJ), rng.choice(surnames)])} Bridge")
        bridges.append(add("bridge", name, year=rng.randint(1820, 1995), kind=rng.choice(BRIDGE_KINDS)))
        town["rel"]["bridge"] = bridges[-1]["id"]
        bridges[-1]["rel"]["town"] = town["id"]

    pick = lambda xs: rng.choice(xs)["id"]  # noqa: E731
    for town in towns:
        town["rel"]["river"] = pick(rivers)
        town["rel"]["mayor"] = pick(people)
    for river in rivers:  # a river with towns on it rises near one of them; a river without any has no source
        on_it = [t for t in towns if t["rel"]["river"] == river["id"]]
        if on_it:
            river["rel"]["source"] = pick(on_it)
    for bridge in bridges:
        bridge["rel"]["builder"] = pick(companies)
        bridge["rel"]["engineer"] = pick(people)
        bridge["river"] = world[world[bridge["rel"]["town"]]["rel"]["river"]]["id"]
    founders = rng.sample(people, len(companies))  # a person founds at most one company
    for company, founder in zip(companies, founders):
        company["rel"]["founder"] = founder["id"]
        company["rel"]["seat"] = pick(towns)
        founder["rel"]["founded"] = company["id"]
    for uni in universities:
        uni["rel"]["founder"] = pick(people)
    by_age = sorted(people, key=lambda p: (p["year"], p["id"]))
    for person in people:
        person["rel"]["born_in"] = pick(towns)
        person["rel"]["studied_at"] = pick(universities)
        older = [p for p in by_age if 12 <= person["year"] - p["year"] <= 45]
        if older:
            person["rel"]["mentor"] = rng.choice(older)["id"]
    return world


# --------------------------------------------------------------------------------------------------------- articles
def _filler(rng: random.Random, e: dict) -> list[str]:
    """Sentences about minor things; numbers and years are deliberate distractors for the one asked about."""
    r = rng.randint
    minor = lambda: f"{rng.choice(MINOR_FIRST)} {rng.choice(MINOR_LAST)}"  # noqa: E731
    children = lambda n: "one child" if n == 1 else f"{n} children"  # noqa: E731
    year = e.get("year", 1900)
    if e["type"] == "person":
        he, his, him = ("she", "her", "her") if e["she"] else ("he", "his", "him")
        died = year + r(48, 91)
        return [
            f"As a child {he} collected {rng.choice(['fossils', 'coins', 'maps', 'pressed flowers', 'stamps'])} and "
            f"kept a diary that eventually ran to {r(8, 60)} volumes.",
            f"In {year + r(22, 35)} {he} married {minor()}; they had {children(r(1, 6))}.",
            f"{he.capitalize()} spoke {r(2, 5)} languages and translated a treatise on {rng.choice(FIELDS)} into "
            f"{rng.choice(LANGUAGES)}.",
            f"In {year + r(30, 60)} {he} received the {rng.choice(ADJ)} Medal for work in {rng.choice(FIELDS)}.",
            f"For {r(5, 30)} years {he} lived in a narrow house on {rng.choice(ADJ)} Lane, which is now a small "
            "museum with a reading room.",
            f"About {r(40, 400)} of {his} notebooks are kept in the {rng.choice(ADJ)} Archive.",
            f"Colleagues remembered {him} as {rng.choice(TRAITS)}, and fond of {rng.choice(HOBBIES)}.",
            f"{he.capitalize()} published {r(12, 140)} papers; the best known is a short study of "
            f"{rng.choice(PRODUCTS)}.",
            f"A portrait of {him} by the painter {minor()} hangs in the {rng.choice(ADJ)} Hall.",
            f"{he.capitalize()} died in {died} at the age of {died - year}.",
            f"Before that {he} worked for {r(2, 12)} years as a clerk in a firm that sold {rng.choice(PRODUCTS)}.",
            f"A street, a school and a {rng.choice(['tram', 'ferry', 'steam engine'])} were later named after {him}.",
            f"{his.capitalize()} letters to {minor()}, some {r(200, 900)} of them, were printed in {died + r(5, 40)}.",
            f"In {year + r(25, 45)} {he} spent a winter in the mountains measuring the flow of {r(3, 19)} streams.",
        ]
    if e["type"] == "town":
        return [
            f"The town has about {r(3, 95) * 1000 + r(0, 999)} inhabitants and lies {r(4, 900)} metres above sea "
            "level.",
            f"Its market square is lined with {rng.choice(COLOURS)} gabled houses from the {r(15, 18)}th century.",
            f"The local speciality is {rng.choice(FOODS)}, served at the {rng.choice(ADJ)} Fair every "
            f"{rng.choice(MONTHS)}.",
            f"Since {r(1950, 2010)} the town has been twinned with the village of {rng.choice(MINOR_LAST)}hof.",
            f"A narrow-gauge railway, opened in {r(1860, 1925)}, links it with {r(3, 14)} villages.",
            f"The {rng.choice(ADJ)} Tower, {r(18, 70)} metres tall, is its oldest surviving building.",
            f"Most people work in {rng.choice(INDUSTRY)}, in the {rng.choice(['timber', 'paper', 'dairy', 'wool'])} "
            "trade or for the regional government.",
            f"The town's coat of arms shows a {rng.choice(ANIMALS)} holding a {rng.choice(OBJECTS)}.",
            f"Winters are long; the mean temperature in July is {r(14, 24)} degrees.",
            f"A regatta has been rowed there every {rng.choice(MONTHS)} since {r(1820, 1960)}.",
            f"Its library holds about {r(20, 400) * 1000} volumes, among them {r(3, 90)} medieval manuscripts.",
            f"A great fire in {r(1500, 1880)} destroyed {r(20, 300)} houses, and the old town was rebuilt in stone.",
            f"The weekly market on {rng.choice(['Mondays', 'Wednesdays', 'Fridays', 'Saturdays'])} draws farmers "
            f"from {r(10, 60)} kilometres around.",
        ]
    if e["type"] == "bridge":
        return [
            f"It is {r(60, 1400)} metres long and has {r(2, 14)} spans of {rng.choice(MATERIALS)}.",
            f"About {r(2, 60) * 1000} vehicles cross it on an ordinary day.",
            f"The deck was widened in {year + r(20, 60)} and repainted {rng.choice(COLOURS)} in {r(1990, 2020)}.",
            f"A bronze plaque on the {rng.choice(['north', 'south', 'east', 'west'])} pier lists the {r(2, 40)} "
            "workers who died while it was being built.",
            f"Ice floes damaged two of its piers in the winter of {year + r(5, 70)}.",
            f"The bridge appears on the {rng.choice([5, 10, 20, 50])}-crown banknote.",
            f"Its {r(20, 160)} lamps were converted to electric light in {r(1900, 1935)}.",
            f"Building it took about {r(500, 30000)} tonnes of steel and {r(1000, 90000)} tonnes of stone.",
            f"Every {rng.choice(MONTHS)} a race is run across it and back, {r(3, 21)} kilometres in all.",
            f"Its toll, {r(1, 9)} pennies for a cart, was abolished in {r(1890, 1950)}.",
            f"The painter {rng.choice(MINOR_FIRST)} {rng.choice(MINOR_LAST)} made {r(4, 30)} studies of it at dawn.",
            f"Pedestrians have a walkway {r(2, 5)} metres wide on its upstream side.",
            f"Its foundations reach {r(6, 40)} metres below the riverbed, on piles of {rng.choice(MATERIALS)}.",
            f"During a storm in {r(1900, 2015)} it swayed so much that it was closed for {r(2, 30)} days.",
            f"A small museum in its {rng.choice(['north', 'south'])} tower shows {r(20, 200)} photographs of its "
            "construction.",
        ]
    if e["type"] == "company":
        return [
            f"The company employs about {r(3, 90) * 100} people and also makes {rng.choice(PRODUCTS)} and "
            f"{rng.choice(PRODUCTS)}.",
            f"Its first workshop was a converted {rng.choice(['brewery', 'chapel', 'stable', 'mill', 'warehouse'])} "
            f"on {rng.choice(ADJ)} Street.",
            f"In {year + r(5, 40)} it opened a second works for {rng.choice(PRODUCTS)}.",
            f"Its emblem, a {rng.choice(COLOURS)} {rng.choice(ANIMALS)}, dates from {year + r(1, 60)}.",
            f"Turnover reached {r(2, 900)} million crowns in {r(1960, 2020)}.",
            f"A strike in {year + r(10, 70)} lasted {r(3, 120)} days and ended with a shorter working week.",
            f"The firm's apprentice school has trained some {r(300, 9000)} workers.",
            f"During the depression of {r(1920, 1935)} it survived by making {rng.choice(PRODUCTS)}.",
            f"Its archive of {r(2, 60) * 1000} drawings was given to a museum in {r(1980, 2015)}.",
            f"For a time its works band, led by {rng.choice(MINOR_FIRST)} {rng.choice(MINOR_LAST)}, won every "
            "regional contest.",
            f"The company's chimney, {r(30, 110)} metres tall, is a listed monument.",
            f"Its records show {r(20, 400)} patents, most of them for {rng.choice(PRODUCTS)}.",
            f"A fire in {year + r(3, 80)} destroyed its pattern shop and {r(200, 5000)} wooden moulds.",
            f"It ran its own football team, which played {r(3, 30)} seasons in the second division.",
        ]
    if e["type"] == "university":
        return [
            f"It has about {r(2, 40) * 1000} students in {r(3, 12)} faculties.",
            f"Its library, the {rng.choice(ADJ)} Library, holds {r(1, 30) * 100000} volumes.",
            f"The observatory on its roof was built in {year + r(50, 250)}.",
            f"Its rowing club races every {rng.choice(MONTHS)} on {rng.choice(MINOR_LAST)} Lake.",
            f"The main hall seats {r(300, 2500)} and has a painted ceiling of the {r(17, 19)}th century.",
            f"Lectures were given only in {rng.choice(LANGUAGES)} until {r(1800, 1930)}.",
            f"Its botanical garden keeps {r(2000, 15000)} species, among them a rare "
            f"{rng.choice(['fern', 'orchid', 'moss'])}.",
            f"Women were first admitted in {r(1870, 1925)}.",
            f"A student revolt in {r(1840, 1970)} closed it for {r(2, 14)} months.",
            f"The university press has printed about {r(1, 9) * 1000} titles.",
            f"Its coat of arms shows an open book and a {rng.choice(ANIMALS)}.",
            f"The anatomy theatre, opened in {year + r(30, 200)}, seats {r(60, 300)} students on steep benches.",
            f"Each {rng.choice(MONTHS)} its choir sings a concert of {r(8, 30)} songs in the cathedral square.",
            f"Its oldest building, a former {rng.choice(['monastery', 'customs house', 'arsenal'])}, has "
            f"{r(40, 300)} rooms.",
        ]
    # river
    return [
        f"It is fed by {r(3, 30)} tributaries, the largest being the {rng.choice(MINOR_LAST)}bach.",
        f"Its basin covers about {r(800, 40000)} square kilometres.",
        f"{rng.choice(FISH).capitalize()} and {rng.choice(FISH)} are common in its lower reaches.",
        f"The river froze over from bank to bank in the winter of {r(1700, 1960)}.",
        f"Barges carried {rng.choice(GOODS)} and {rng.choice(GOODS)} on it until {r(1900, 1970)}.",
        f"A flood in {r(1600, 2000)} rose {r(2, 9)} metres above the usual level.",
        f"Its water is {rng.choice(['clear', 'brown with peat', 'greenish', 'cold even in summer'])} and it is "
        f"navigable for {r(20, 300)} kilometres.",
        f"Along its banks grow {rng.choice(['alders', 'willows', 'poplars', 'reeds'])}, and {rng.choice(BIRDS)} "
        "nest on its islands.",
        f"A towpath of {r(30, 200)} kilometres follows its left bank.",
        f"Some {r(3, 40)} water mills once stood on it; {r(1, 3)} still turn.",
        f"Its mean flow at the mouth is {r(20, 900)} cubic metres per second.",
        f"In {r(1780, 1900)} a canal of {r(4, 60)} kilometres joined it to the {rng.choice(MINOR_LAST)} Canal.",
        f"An old ferry, in service since {r(1850, 1950)}, still crosses it {r(4, 30)} times a day.",
        f"Its delta holds {r(5, 60)} islands, the largest {r(2, 40)} square kilometres.",
    ]


def _facts(e: dict, world: dict) -> list[str]:
    """The article's key facts: its defining sentence first, then one sentence per relation."""
    rel = {k: world[v]["name"] for k, v in e["rel"].items()}
    n = e["name"]
    if e["type"] == "person":
        he, his = ("She", "Her") if e["she"] else ("He", "His")
        out = [f"{n} (born {e['year']}) was a {e['profession']} from {world[e['rel']['born_in']]['country']}.",
               f"{he} was born in the town of {rel['born_in']}.",
               f"{he} studied at {rel['studied_at']}."]
        if "mentor" in rel:
            out.append(f"{his} mentor and teacher was {rel['mentor']}.")
        if "founded" in rel:
            out.append(f"{he} founded the company {rel['founded']}.")
        return out
    if e["type"] == "town":
        return [f"{n} is a town in {e['country']}, founded in {e['year']}.",
                f"It lies on the {rel['river']}.",
                f"The only bridge in {n} is {rel['bridge']}.",
                f"The mayor of {n} is {rel['mayor']}."]
    if e["type"] == "bridge":
        river = world[e["river"]]["name"]
        return [f"{n} is a {e['kind']} bridge over the {river} in the town of {rel['town']}.",
                f"{n} was completed in {e['year']}.",
                f"It was built by the company {rel['builder']}.",
                f"It was designed by the engineer {rel['engineer']}."]
    if e["type"] == "company":
        return [f"{n} is a {e['industry']} company, founded in {e['year']}.",
                f"The founder of {n} was {rel['founder']}.",
                f"{n} has its headquarters in the town of {rel['seat']}."]
    if e["type"] == "university":
        return [f"{n} is a university, founded in {e['year']}.",
                f"{n} stands in the town of {rel['town']}.",
                f"The founder of {n} was {rel['founder']}."]
    out = [f"The {n} is a river in {e['country']}, {e['length_km']} kilometres long, that flows into {e['sea']}."]
    if "source" in rel:
        out.append(f"The source of the {n} is near the town of {rel['source']}.")
    return out


def write_article(rng: random.Random, e: dict, world: dict) -> dict:
    """Key facts scattered among filler facts: the defining sentence first, the others at random places, so that
    finding a fact means reading the article, not its first line."""
    facts, filler = _facts(e, world), _filler(rng, e)
    rng.shuffle(filler)
    body = filler[:14]
    for fact in facts[1:]:
        body.insert(rng.randint(0, len(body)), fact)
    return {"id": e["id"], "title": e["name"], "text": " ".join([facts[0], *body])}


# ------------------------------------------------------------------------------------------------------------ tasks
# relation -> (how a step of the question names the related entity, given how it named this one ({X}); the word
# the next step calls it by: "that engineer")
STEPS = {
    "born_in": ("the town where {X} was born", "town"),
    "studied_at": ("the university where {X} studied", "university"),
    "mentor": ("the mentor of {X}", "mentor"),
    "founded": ("the company founded by {X}", "company"),
    "bridge": ("the bridge in {X}", "bridge"),
    "river": ("the river that flows through {X}", "river"),
    "mayor": ("the mayor of {X}", "mayor"),
    "builder": ("the company that built {X}", "company"),
    "engineer": ("the engineer who designed {X}", "engineer"),
    "founder": ("the founder of {X}", "founder"),
    "seat": ("the town where {X} has its headquarters", "town"),
    "town": ("the town where {X} stands", "town"),
    "source": ("the town near the source of {X}", "town"),
}
QUESTIONS = {  # type of the chain's last entity -> (question, answer field, the answer's kind for the prompt)
    "person": ("In what year was {X} born?", "year", "the year"),
    "town": ("In what year was {X} founded?", "year", "the year"),
    "bridge": ("In what year was {X} completed?", "year", "the year"),
    "company": ("In what year was {X} founded?", "year", "the year"),
    "university": ("In what year was {X} founded?", "year", "the year"),
    "river": ("How long is {X}, in kilometres?", "length_km", "the number"),
}


def _answer(e: dict) -> str:
    return str(e[QUESTIONS[e["type"]][1]])


def draw_chain(rng: random.Random, world: dict, start: dict, hops: int) -> list[dict] | None:
    """A walk of `hops` distinct entities from `start` along relations (the same relation never twice in a row,
    which reads badly: "the mentor of the mentor of ..."), or None when it gets stuck."""
    chain, rels = [start], []
    while len(chain) < hops:
        here = chain[-1]
        options = [(r, world[t]) for r, t in sorted(here["rel"].items())
                   if world[t] not in chain and (not rels or r != rels[-1])]
        if not options:
            return None
        r, nxt = rng.choice(options)
        chain.append(nxt)
        rels.append(r)
    # the answer must differ from the previous entity's (the perturbation that submits it must fail)
    if _answer(chain[-1]) == _answer(chain[-2]):
        return None
    return [{"entity": e, "rel": r} for e, r in zip(chain, [None, *rels])]


def make_task(chain: list[dict], task_id: str) -> dict:
    """The question as steps ("Start from Ada Vell. Find the town where Ada Vell was born, then the bridge in that
    town, ... In what year was that company founded?"): a nested phrase of seven relative clauses is a parsing
    puzzle of its own, and the steps let a reader (or a context that lost its history) see where it stands."""
    start = chain[0]["entity"]["name"]
    steps, name = [], start
    for step in chain[1:]:
        phrase, role = STEPS[step["rel"]]
        steps.append(phrase.format(X=name))
        name = f"that {role}"
    last = chain[-1]["entity"]
    question, _, kind = QUESTIONS[last["type"]]
    prompt = f"Start from {start}. Find {', then '.join(steps)}. {question.format(X=name)} Answer with {kind} only."
    return {
        "id": task_id, "prompt": prompt, "answers": [_answer(last)],
        "hops": [{"query": s["entity"]["name"], "doc": s["entity"]["id"]} for s in chain],
        # the same kind of value one article earlier: a wrong answer check_env submits (env.py perturb_submission)
        "previous_answer": _answer(chain[-2]["entity"]),
    }


def make_tasks(rng: random.Random, world: dict) -> tuple[list[dict], list[dict]]:
    """Training and held-out tasks, equal shares of each hop count; held-out ones start from entities that no
    training task starts from, and no two tasks share a question."""
    entities = [world[k] for k in world]  # creation order: deterministic
    rng.shuffle(entities)
    eval_starts = {e["id"] for e in entities[: len(entities) // 4]}
    out = {"train": [], "eval": []}
    prompts = set()
    for split, n in (("train", N_TRAIN), ("eval", N_EVAL)):
        pool = [e for e in entities if (e["id"] in eval_starts) == (split == "eval")]
        for k in range(n):
            hops = HOPS[k % len(HOPS)]
            for _ in range(10000):
                chain = draw_chain(rng, world, rng.choice(pool), hops)
                if chain is None:
                    continue
                task = make_task(chain, f"search_long-{'eval-' if split == 'eval' else ''}{k:03d}")
                if task["prompt"] not in prompts:
                    break
            else:
                raise RuntimeError(f"no new {hops}-hop chain found for {split} task {k}")
            prompts.add(task["prompt"])
            out[split].append(task)
    return out["train"], out["eval"]


# ------------------------------------------------------------------------------------------------------------- main
def generate() -> tuple[list[dict], list[dict], list[dict]]:
    """(docs, training tasks, held-out tasks), the same on every call."""
    rng = random.Random(SEED)
    world = make_world(rng)
    docs = [write_article(rng, world[k], world) for k in world]
    train, held_out = make_tasks(rng, world)
    return docs, train, held_out


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write docs.jsonl, tasks.jsonl and eval.jsonl into this directory instead")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from rollout.envs.base import check_env, load_env

    docs, train, held_out = generate()
    with tempfile.TemporaryDirectory() as tmp:  # built and checked aside; written only when it all passes
        work = Path(tmp) / "search_long"
        shutil.copytree(HERE, work, ignore=shutil.ignore_patterns("__pycache__", "*.jsonl"))
        (work / "docs.jsonl").write_text(_jsonl(docs), encoding="utf-8")
        (work / "tasks.jsonl").write_text(_jsonl(train), encoding="utf-8")
        report = check_env(load_env(str(work)), train + held_out)
        if not report["ok"]:
            raise SystemExit("check_env failed:\n" + "\n".join(report["failures"]))
    out = Path(args.out) if args.out else HERE
    out.mkdir(parents=True, exist_ok=True)
    (out / "docs.jsonl").write_text(_jsonl(docs), encoding="utf-8")
    (out / "tasks.jsonl").write_text(_jsonl(train), encoding="utf-8")
    (out / "eval.jsonl" if args.out else EVAL_PATH).write_text(_jsonl(held_out), encoding="utf-8")
    print(f"wrote {len(docs)} articles, {len(train)} training and {len(held_out)} held-out tasks; check_env: "
          f"{report['reference_passed']}/{report['with_reference']} reference solutions pass, "
          f"{report['perturbed_failed']}/{report['perturbed']} perturbed ones fail")


if __name__ == "__main__":
    main()
