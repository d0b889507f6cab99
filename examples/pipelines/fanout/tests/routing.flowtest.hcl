# The by_type route sends each event down one branch: purchases are priced, sign-ups go to the file,
# and the rest is activity, of which only the clicks are logged.

run "each type of event takes its branch" {
  send {
    source = source.events
    messages = [
      { user = "user-1", seq = 1, type = "view", page = "/", price = 10 },
      { user = "user-1", seq = 2, type = "purchase", page = "/pricing", price = 10 },
      { user = "user-2", seq = 3, type = "signup", page = "/", price = 20 },
      { user = "user-2", seq = 4, type = "click", page = "/docs", price = 30 },
      { user = "user-1", seq = 5, type = "click", page = "/blog", price = 40 },
      { user = "user-2", seq = 6, type = "purchase", page = "/pricing", price = 50 },
      { user = "user-1", seq = 7, type = "purchase", page = "/pricing", price = 20 },
      { user = "user-2", seq = 8, type = "view", page = "/docs", price = 10 },
    ]
  }
  # The purchases keep their user's key, and each user's purchases their order. Gross adds the
  # default VAT of 19%, rounded to cents; the price becomes net.
  expect {
    sink = sink.purchases
    messages = [
      { key = "user-1", payload = { user = "user-1", seq = 2, type = "purchase", page = "/pricing", net = 10, gross = 11.9 } },
      { key = "user-1", payload = { user = "user-1", seq = 7, type = "purchase", page = "/pricing", net = 20, gross = 23.8 } },
      { key = "user-2", payload = { user = "user-2", seq = 6, type = "purchase", page = "/pricing", net = 50, gross = 59.5 } },
    ]
  }
  # Sign-ups are written as they came, unpriced.
  expect {
    sink     = sink.signups
    messages = [{ key = "user-2", payload = { user = "user-2", seq = 3, type = "signup", page = "/", price = 20 } }]
  }
  # Everything else is activity: views and clicks.
  expect {
    topic = topic.activity
    messages = [
      { key = "user-1", payload = { user = "user-1", seq = 1, type = "view", page = "/", price = 10 } },
      { key = "user-1", payload = { user = "user-1", seq = 5, type = "click", page = "/blog", price = 40 } },
      { key = "user-2", payload = { user = "user-2", seq = 4, type = "click", page = "/docs", price = 30 } },
      { key = "user-2", payload = { user = "user-2", seq = 8, type = "view", page = "/docs", price = 10 } },
    ]
  }
  # The clicks stage has ordering = "none": its clicks may come in any order.
  expect {
    sink  = sink.click_log
    match = "unordered"
    messages = [
      { user = "user-1", seq = 5, type = "click", page = "/blog", price = 40 },
      { user = "user-2", seq = 4, type = "click", page = "/docs", price = 30 },
    ]
  }
  assert {
    condition     = metrics.clicks.filtered == 2 && metrics.by_type.dead_lettered == 0
    error_message = "the two views are filtered out of the click log, and nothing fails"
  }
}

run "an event of another type is activity, and not a click" {
  send {
    source   = source.events
    messages = [{ user = "user-3", seq = 9, type = "scroll", page = "/blog", price = 10 }]
  }
  expect {
    topic    = topic.activity
    messages = [{ key = "user-3", payload = { user = "user-3", seq = 9, type = "scroll", page = "/blog", price = 10 } }]
  }
  expect {
    sink  = sink.click_log
    count = 0
  }
  expect {
    sink  = sink.purchases
    count = 0
  }
  expect {
    sink  = sink.signups
    count = 0
  }
  assert {
    condition     = metrics.clicks.filtered == 1
    error_message = "the scroll is filtered out of the click log"
  }
}

run "each user's events stay in order on every branch" {
  # Three users, interleaved, several events of each type: exact matching checks each key's order.
  send {
    source = source.events
    messages = [
      { user = "user-a", seq = 1, type = "purchase", page = "/", price = 10 },
      { user = "user-b", seq = 2, type = "signup", page = "/", price = 10 },
      { user = "user-c", seq = 3, type = "purchase", page = "/", price = 30 },
      { user = "user-a", seq = 4, type = "signup", page = "/", price = 10 },
      { user = "user-b", seq = 5, type = "purchase", page = "/", price = 20 },
      { user = "user-a", seq = 6, type = "purchase", page = "/", price = 40 },
      { user = "user-c", seq = 7, type = "signup", page = "/", price = 10 },
      { user = "user-b", seq = 8, type = "purchase", page = "/", price = 50 },
      { user = "user-a", seq = 9, type = "signup", page = "/", price = 10 },
      { user = "user-c", seq = 10, type = "purchase", page = "/", price = 10 },
      { user = "user-b", seq = 11, type = "signup", page = "/", price = 10 },
      { user = "user-a", seq = 12, type = "purchase", page = "/", price = 20 },
    ]
  }
  expect {
    sink = sink.purchases
    messages = [
      { key = "user-a", payload = { user = "user-a", seq = 1, type = "purchase", page = "/", net = 10, gross = 11.9 } },
      { key = "user-a", payload = { user = "user-a", seq = 6, type = "purchase", page = "/", net = 40, gross = 47.6 } },
      { key = "user-a", payload = { user = "user-a", seq = 12, type = "purchase", page = "/", net = 20, gross = 23.8 } },
      { key = "user-b", payload = { user = "user-b", seq = 5, type = "purchase", page = "/", net = 20, gross = 23.8 } },
      { key = "user-b", payload = { user = "user-b", seq = 8, type = "purchase", page = "/", net = 50, gross = 59.5 } },
      { key = "user-c", payload = { user = "user-c", seq = 3, type = "purchase", page = "/", net = 30, gross = 35.7 } },
      { key = "user-c", payload = { user = "user-c", seq = 10, type = "purchase", page = "/", net = 10, gross = 11.9 } },
    ]
  }
  expect {
    sink = sink.signups
    messages = [
      { key = "user-a", payload = { user = "user-a", seq = 4, type = "signup", page = "/", price = 10 } },
      { key = "user-a", payload = { user = "user-a", seq = 9, type = "signup", page = "/", price = 10 } },
      { key = "user-b", payload = { user = "user-b", seq = 2, type = "signup", page = "/", price = 10 } },
      { key = "user-b", payload = { user = "user-b", seq = 11, type = "signup", page = "/", price = 10 } },
      { key = "user-c", payload = { user = "user-c", seq = 7, type = "signup", page = "/", price = 10 } },
    ]
  }
}
