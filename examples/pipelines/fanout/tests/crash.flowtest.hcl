# A process dies in the middle of the stream: the one that takes its partitions over goes on where
# it stopped, so that no event is lost or written twice and each user's events keep their order.

run "a crash loses nothing and keeps each user's order" {
  send {
    source = source.events
    messages = [
      { user = "user-1", seq = 1, type = "purchase", page = "/", price = 10 },
      { user = "user-2", seq = 2, type = "signup", page = "/", price = 10 },
      { user = "user-1", seq = 3, type = "signup", page = "/", price = 10 },
    ]
  }
  step {
    crash = true # killed as SIGKILL would; the new process waits for the dead one's leases to expire
    send {
      source = source.events
      messages = [
        { user = "user-1", seq = 4, type = "purchase", page = "/", price = 20 },
        { user = "user-2", seq = 5, type = "purchase", page = "/", price = 30 },
        { user = "user-1", seq = 6, type = "signup", page = "/", price = 10 },
      ]
    }
  }
  expect {
    sink = sink.purchases
    messages = [
      { key = "user-1", payload = { user = "user-1", seq = 1, type = "purchase", page = "/", net = 10, gross = 11.9 } },
      { key = "user-1", payload = { user = "user-1", seq = 4, type = "purchase", page = "/", net = 20, gross = 23.8 } },
      { key = "user-2", payload = { user = "user-2", seq = 5, type = "purchase", page = "/", net = 30, gross = 35.7 } },
    ]
  }
  expect {
    sink = sink.signups
    messages = [
      { key = "user-1", payload = { user = "user-1", seq = 3, type = "signup", page = "/", price = 10 } },
      { key = "user-1", payload = { user = "user-1", seq = 6, type = "signup", page = "/", price = 10 } },
      { key = "user-2", payload = { user = "user-2", seq = 2, type = "signup", page = "/", price = 10 } },
    ]
  }
}
