from strkit import camel_case, snake_case, split_words, title_case


def test_split_words():
    assert split_words("parseHTTPResponse") == ["parse", "HTTP", "Response"]
    assert split_words("user_id") == ["user", "id"]


def test_snake_case():
    assert snake_case("userId") == "user_id"
    assert snake_case("UserAccountId") == "user_account_id"
    assert snake_case("first-name  last") == "first_name_last"


def test_snake_case_acronym():
    assert snake_case("HTTPServerError") == "http_server_error"


def test_camel_case():
    assert camel_case("user id") == "userId"
    assert camel_case("user_account_id") == "userAccountId"
    assert camel_case("user id", upper_first=True) == "UserId"
    assert camel_case("") == ""


def test_title_case_minor_words():
    assert title_case("the lord of the rings") == "The Lord of the Rings"
    assert title_case("  war   and peace ") == "War and Peace"


def test_title_case_last_word():
    assert title_case("what are you looking for") == "What Are You Looking For"
