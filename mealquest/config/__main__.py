"""`python -m mealquest.config`: print the settings reference's table from the table itself."""

from mealquest.config.table import markdown_table

print(markdown_table(), end="")
