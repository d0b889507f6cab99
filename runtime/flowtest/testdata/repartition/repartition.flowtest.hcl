run "a fast region does not make a slow region's orders late" {
  step {
    send {
      topic = topic.orders
      messages = [
        { region = "north", customer = "c1", at = "2026-01-01T00:00:10Z" },
        { region = "north", customer = "c1", at = "2026-01-01T00:05:00Z" },
      ]
    }
  }
  step {
    # The north partition's watermark is at 00:05, the eu partition's has none: the minute
    # 00:00-00:01 stays open for eu's order, which is not late.
    send {
      topic    = topic.orders
      messages = [{ region = "eu", customer = "c1", at = "2026-01-01T00:00:40Z" }]
    }
    expect {
      sink  = sink.out
      count = 0
    }
    expect_dead_letters {
      stage = stage.per_customer
      count = 0
    }
  }
  step {
    # Both partitions go idle: once they have been for the idle timeout (a minute) their watermarks move
    # with the clock, eu's from 00:00:40, which closes the first minute but not yet north's 00:05 one.
    advance = "5m"
    expect {
      sink = sink.out
      messages = [
        { key = "c1", orders = 2, window = { start = "2026-01-01T00:00:00Z", end = "2026-01-01T00:01:00Z" } },
      ]
    }
  }
}

run "the watermark is the slowest writer's" {
  reset = true
  send {
    topic = topic.orders
    messages = [
      { region = "north", customer = "c2", at = "2026-01-01T00:00:10Z" },
      { region = "eu", customer = "c2", at = "2026-01-01T00:00:20Z" },
      { region = "north", customer = "c2", at = "2026-01-01T00:03:00Z" },
      { region = "eu", customer = "c2", at = "2026-01-01T00:01:30Z" },
    ]
  }
  # north is at 00:03 and eu at 00:01:30: the first minute closes, the second (eu's order at
  # 00:01:30) stays open though north has passed it.
  expect {
    sink = sink.out
    messages = [
      { key = "c2", orders = 2, window = { start = "2026-01-01T00:00:00Z", end = "2026-01-01T00:01:00Z" } },
    ]
  }
}
