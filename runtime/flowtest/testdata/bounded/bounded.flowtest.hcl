run "a third key is dead-lettered, and the two held go on" {
  send {
    topic = topic.orders
    messages = [
      { id = "o1", at = "2026-01-01T00:00:00Z" },
      { id = "o2", at = "2026-01-01T00:01:00Z" },
      { id = "o3", at = "2026-01-01T00:02:00Z" },
      { id = "o1", at = "2026-01-01T00:03:00Z" },
      { id = "o2", at = "2026-01-01T00:04:00Z" },
    ]
  }
  send {
    topic = topic.clicks
    messages = [
      { user = "a", at = "2026-01-01T00:00:00Z" },
      { user = "b", at = "2026-01-01T00:00:10Z" },
      { user = "c", at = "2026-01-01T00:00:20Z" },
      { user = "a", at = "2026-01-01T00:00:30Z" },
    ]
  }
  expect {
    sink = sink.orders
    messages = [
      { id = "o1", at = "2026-01-01T00:00:00Z" },
      { id = "o2", at = "2026-01-01T00:01:00Z" },
    ]
  }
  expect_dead_letters {
    stage    = stage.once
    count    = 1
    messages = [{ payload = { id = "o3", at = "2026-01-01T00:02:00Z" }, reason = "partition 0 of stage once already holds max_keys = 2 keys", attempts = 1 }]
  }
  expect_dead_letters {
    stage    = stage.per_minute
    count    = 1
    messages = [{ payload = { user = "c", at = "2026-01-01T00:00:20Z" }, reason = "partition 0 of stage per_minute already holds max_keys = 2 keys" }]
  }
  assert {
    condition     = metrics.once.duplicates == 2
    error_message = "the copies of o1 and o2 are duplicates"
  }
}

run "the count of keys survives a crash" {
  step {
    crash = true
  }
  step {
    send {
      topic    = topic.orders
      messages = [{ id = "o3", at = "2026-01-01T00:05:00Z" }]
    }
    send {
      topic    = topic.clicks
      messages = [{ user = "c", at = "2026-01-01T00:00:40Z" }]
    }
  }
  expect {
    sink  = sink.orders
    count = 0
  }
  expect_dead_letters {
    stage    = stage.once
    messages = [{ payload = { id = "o3", at = "2026-01-01T00:05:00Z" }, reason = "already holds max_keys = 2 keys" }]
  }
  expect_dead_letters {
    stage    = stage.per_minute
    messages = [{ payload = { user = "c", at = "2026-01-01T00:00:40Z" }, reason = "already holds max_keys = 2 keys" }]
  }
}

run "a key forgotten, or a group whose windows closed, frees its place" {
  step {
    # o2 again, 9.5 minutes after its first: a duplicate, whose time moves the watermark past o1's
    # 10 minutes. b's next minute closes the first minute, a's last window.
    send {
      topic    = topic.orders
      messages = [{ id = "o2", at = "2026-01-01T00:10:30Z" }]
    }
    send {
      topic    = topic.clicks
      messages = [{ user = "b", at = "2026-01-01T00:01:10Z" }]
    }
    expect {
      sink  = sink.clicks
      match = "unordered"
      messages = [
        { key = "a", clicks = 2, window = { start = "2026-01-01T00:00:00Z", end = "2026-01-01T00:01:00Z" } },
        { key = "b", clicks = 1, window = { start = "2026-01-01T00:00:00Z", end = "2026-01-01T00:01:00Z" } },
      ]
    }
  }
  step {
    send {
      topic = topic.orders
      messages = [
        { id = "o3", at = "2026-01-01T00:10:40Z" },
        { id = "o4", at = "2026-01-01T00:10:50Z" }, # o2 and o3 are held
      ]
    }
    send {
      topic = topic.clicks
      messages = [
        { user = "c", at = "2026-01-01T00:01:20Z" },
        { user = "d", at = "2026-01-01T00:01:30Z" }, # b and c are held
      ]
    }
  }
  expect {
    sink     = sink.orders
    messages = [{ id = "o3", at = "2026-01-01T00:10:40Z" }]
  }
  expect_dead_letters {
    stage    = stage.once
    count    = 1
    messages = [{ payload = { id = "o4", at = "2026-01-01T00:10:50Z" }, reason = "already holds max_keys = 2 keys" }]
  }
  expect_dead_letters {
    stage    = stage.per_minute
    count    = 1
    messages = [{ payload = { user = "d", at = "2026-01-01T00:01:30Z" }, reason = "already holds max_keys = 2 keys" }]
  }
  assert {
    condition     = metrics.once.duplicates == 1 && metrics.per_minute.dead_lettered == 1
    error_message = "o2's copy is a duplicate; only d's click is refused"
  }
}
