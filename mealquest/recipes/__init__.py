"""Recipes: the `recipe_import` job kind (`kind`), fetching pages safely (`fetch`,
`addresses`), parsing them (`parse`), and the routes that start imports and read
recipes (`api`)."""
