# Every construct of the test language, decoded by TestLoadDecodesEverything.
variables {
  events = 3
}

mock "acme.score" {
  result { error = "scoring service timeout" }
  result {
    error     = "bad input"
    permanent = true
  }
  result { drop = true }
  result { output = { score = msg.id * 2 } }
  result { outputs = [msg, { copy = true }] }
  result { times = 3 }
}

override_sink "hook" {
  responses = [503, 503, 200]
}

run "happy path" {
  send {
    topic = topic.orders
    messages = [
      { id = 1, amount = 5.5 },
      { key = "c1", payload = { id = 2 }, at = "+5s" },
      { key = "k", payload = { id = 3 }, extra = 1 },
    ]
  }
  advance = "10m"
  expect {
    sink     = sink.out
    messages = [{ id = 1 }]
    match    = "unordered"
    count    = 1
  }
  expect {
    topic = stage.tag
    file  = "golden/missing.jsonl"
  }
  expect_dead_letters {
    stage    = stage.score
    count    = 1
    messages = [{ payload = { id = 2 }, reason = "timeout", attempts = 3 }, {}]
  }
  assert {
    condition     = length(output.out) == 1 && metrics.score.retried == 2 && length(dead_letters.score) == 1
    error_message = "exactly one order gets out"
  }
  step { crash = true }
  step {
    send {
      source = source.orders
      file   = "fixtures/orders.jsonl"
    }
    advance = "1s"
    expect {
      sink  = sink.out
      count = 2
    }
    assert { condition = length(output["tag.out"]) >= 0 }
  }
}

run "second" {
  reset = true
  expect {
    topic = topic.enriched
    file  = "golden/enriched.jsonl"
  }
}
