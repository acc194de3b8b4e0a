from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse

from tests.django_project.shop.jobs import Ship, ship
from tests.django_project.shop.models import Order


class OutOfStock(Exception):
    pass


# --8<-- [start:view]
def place_order(request: HttpRequest) -> JsonResponse:
    try:
        with transaction.atomic():
            order = Order.objects.create(email=request.POST["email"])
            ship.enqueue(connection, Ship(order_id=order.id))  # commits with the order, or not at all
            if request.POST.get("sku") == "sold-out":
                raise OutOfStock  # rolls back the order and its job
    except OutOfStock:
        return JsonResponse({"error": "out of stock"}, status=409)
    return JsonResponse({"order": order.id}, status=201)


# --8<-- [end:view]
