from strkit import is_palindrome, reading_time, top_words, word_count


def test_word_count():
    assert word_count("Don't panic, it's fine.") == 4
    assert word_count("") == 0


def test_word_count_numbers():
    assert word_count("3 little pigs and 1 wolf") == 6


def test_top_words():
    assert top_words("b a b c a b", 2) == [("b", 3), ("a", 2)]
    assert top_words("pear fig apple fig pear apple kiwi", 3) == [("apple", 2), ("fig", 2), ("pear", 2)]


def test_is_palindrome():
    assert is_palindrome("A man, a plan, a canal: Panama")
    assert not is_palindrome("hello")
    assert not is_palindrome("")


def test_is_palindrome_digits():
    assert is_palindrome("12321")
    assert not is_palindrome("1231")


def test_is_palindrome_accents():
    assert is_palindrome("Ésope reste ici et se repose")


def test_reading_time():
    assert reading_time("word " * 450) == 3
    assert reading_time("one two") == 1
    assert reading_time("") == 0
