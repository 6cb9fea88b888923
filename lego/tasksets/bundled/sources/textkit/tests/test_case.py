from textkit import split_words, to_camel, to_constant, to_kebab, to_pascal, to_snake, to_title


def test_split_words_styles():
    assert split_words("hello world") == ["hello", "world"]
    assert split_words("hello_world") == ["hello", "world"]
    assert split_words("helloWorld") == ["hello", "World"]
    assert split_words("HelloWorld") == ["Hello", "World"]
    assert split_words("hello-world-2") == ["hello", "world", "2"]


def test_conversions():
    assert to_snake("parseRequestBody") == "parse_request_body"
    assert to_kebab("ParseRequestBody") == "parse-request-body"
    assert to_camel("parse_request_body") == "parseRequestBody"
    assert to_pascal("parse request body") == "ParseRequestBody"
    assert to_title("parse_request_body") == "Parse Request Body"
    assert to_constant("maxRetryCount") == "MAX_RETRY_COUNT"


def test_empty():
    assert to_camel("") == ""
    assert to_snake("") == ""
