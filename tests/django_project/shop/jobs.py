"""This app's jobs: `dygo.contrib.django` imports every installed app's jobs.py when Django starts."""

from pydantic import BaseModel

from dygo import JobContext, job
from tests.django_project.shop.models import Order


class Ship(BaseModel):
    order_id: int


# --8<-- [start:job]
@job("shop.ship")
def ship(ctx: JobContext, args: Ship) -> None:
    # A plain `def` runs in a thread of its own, where the ORM works as in a view.
    Order.objects.filter(id=args.order_id).update(shipped=True)


# --8<-- [end:job]
