from strkit import slugify, unique_slug


def test_slugify_basic():
    assert slugify("Hello, World!") == "hello-world"
    assert slugify("already-a-slug") == "already-a-slug"


def test_slugify_keeps_digits():
    assert slugify("Top 10 tips for 2024") == "top-10-tips-for-2024"


def test_slugify_accents():
    assert slugify("Café au lait") == "cafe-au-lait"
    assert slugify("Crème brûlée") == "creme-brulee"


def test_slugify_separators():
    assert slugify("  --Hi there!--  ") == "hi-there"
    assert slugify("a b  c", sep="_") == "a_b_c"


def test_slugify_max_len_cuts_at_a_separator():
    assert slugify("the quick brown fox", max_len=12) == "the-quick"
    assert slugify("the quick brown fox", max_len=9) == "the-quick"
    assert slugify("the quick brown fox", max_len=10) == "the-quick"
    assert slugify("abcdefgh", max_len=5) == "abcde"


def test_unique_slug():
    assert unique_slug("My Post", set()) == "my-post"
    assert unique_slug("My Post", {"my-post"}) == "my-post-2"
    assert unique_slug("My Post", {"my-post", "my-post-2"}) == "my-post-3"
    assert unique_slug("!!!", set()) == "item"
