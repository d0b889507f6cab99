# The VAT rate is a variable: gross follows it, rounded half up to cents.

variables {
  vat_rate = 0.075
}

run "gross uses the VAT rate given" {
  send {
    source = source.events
    messages = [
      { user = "user-1", seq = 1, type = "purchase", page = "/", price = 10 },
      { user = "user-1", seq = 2, type = "purchase", page = "/", price = 30 },
    ]
  }
  # 10 * 1.075 = 10.75 exactly; 30 * 1.075 = 32.25.
  expect {
    sink = sink.purchases
    messages = [
      { key = "user-1", payload = { user = "user-1", seq = 1, type = "purchase", page = "/", net = 10, gross = 10.75 } },
      { key = "user-1", payload = { user = "user-1", seq = 2, type = "purchase", page = "/", net = 30, gross = 32.25 } },
    ]
  }
}
