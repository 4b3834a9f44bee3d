"""Money: the price quote and disk quote every part of it passes around (`prices`,
pure), the shipped price book (pure) and its seeding into the database, the
price refreshers that fetch the clouds' prices, the cost ledger (pure), costs from
recorded instances, monthly budgets, and money as people read it (`text`, no Django).

Imports the core; budgets ask the fleet's placement how much work a job has left."""
