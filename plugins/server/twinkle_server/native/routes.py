from fastapi import APIRouter
router = APIRouter(prefix='/twinkle/v1')
